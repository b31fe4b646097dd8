"""A job's checkpoints as callers name them: registered, found, restorable, leased, deleted."""

from __future__ import annotations

from tierpoint.errors.base import TierpointError


class CheckpointConflict(TierpointError):
    code = "checkpoint_conflict"
    status = 409
    title = "A different manifest is registered for this step"


class CheckpointNotFound(TierpointError):
    code = "checkpoint_not_found"
    status = 404
    title = "Checkpoint not found"


class JobNotFound(TierpointError):
    code = "job_not_found"
    status = 404
    title = "Job not found"


class NoRestorableCheckpoint(TierpointError):
    code = "no_restorable_checkpoint"
    status = 404
    title = "No restorable checkpoint"


class NotLeasable(TierpointError):
    code = "not_leasable"
    status = 409
    title = "Checkpoint cannot be leased"


class LeaseNotFound(TierpointError):
    code = "lease_not_found"
    status = 404
    title = "Restore lease not found"


class LeaseEnded(TierpointError):
    code = "lease_ended"
    status = 409
    title = "Restore lease already released or expired"


class TierNeedsRestoreRequest(TierpointError):
    code = "tier_needs_restore_request"
    status = 409
    title = "Tier's objects need an S3 restore request before they can be read"


class TierCopyNotFound(TierpointError):
    code = "tier_copy_not_found"
    status = 404
    title = "No copy on that tier"


class CopyExpiring(TierpointError):
    code = "copy_expiring"
    status = 409
    title = "The copy is being expired"


class CheckpointProtected(TierpointError):
    code = "checkpoint_protected"
    status = 409
    title = "Checkpoint pinned, leased or in flight"


class CheckpointBeingDeleted(TierpointError):
    code = "checkpoint_being_deleted"
    status = 409
    title = "The checkpoint at this step is still being deleted"
