"""A run's timeline (docs/timeline.md): rollbacks, branches, forks, lineage and verdicts."""

from __future__ import annotations

from tierpoint.errors.base import TierpointError


class RollbackConflict(TierpointError):
    """Another rollback changed the job's current branch first; `winner` names it."""

    code = "rollback_conflict"
    status = 409
    title = "Another rollback won"


class CheckpointSuperseded(TierpointError):
    code = "checkpoint_superseded"
    status = 409
    title = "The checkpoint is superseded"


class NotRestorable(TierpointError):
    code = "not_restorable"
    status = 409
    title = "The checkpoint is not restorable"


class RollbackToFuture(TierpointError):
    code = "rollback_to_future"
    status = 422
    title = "The step is after the timeline's newest"


class BranchNotFound(TierpointError):
    code = "branch_not_found"
    status = 404
    title = "No such branch"


class BranchSuperseded(TierpointError):
    """A registration names a branch that a rollback has left."""

    code = "branch_superseded"
    status = 409
    title = "The branch is no longer current"


class VerdictConflict(TierpointError):
    code = "verdict_conflict"
    status = 409
    title = "The verdict cannot change so"


class LineageCycle(TierpointError):
    code = "lineage_cycle"
    status = 422
    title = "The lineage would hold a cycle"


class UnknownParent(TierpointError):
    code = "unknown_parent"
    status = 422
    title = "The parent checkpoint does not exist"


class JobExists(TierpointError):
    code = "job_exists"
    status = 409
    title = "The job exists"
