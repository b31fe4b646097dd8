"""Domain errors with a stable machine-readable code and the HTTP status the API answers with.

The API renders every one of them as RFC 9457 problem+json through one exception handler; the CLI
prints `code: detail`. Codes are part of the public contract: never rename one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar


def problem_type(code: str) -> str:
    return f"urn:tierpoint:problem:{code}"


def problem_body(
    status: int,
    code: str,
    title: str,
    detail: str,
    errors: Sequence[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An RFC 9457 problem document: the API's answers and the node data endpoint's."""
    body: dict[str, Any] = {
        "type": problem_type(code),
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    if errors is not None:
        body["errors"] = list(errors)
    for k, v in (extra or {}).items():
        body.setdefault(k, v)
    return body


class TierpointError(Exception):
    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal error"

    def __init__(
        self,
        detail: str,
        *,
        errors: list[dict[str, Any]] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        # Per-field problems: [{"field", "message", "code"}].
        self.errors = errors
        # Extension members of the problem document (RFC 9457 section 3.2).
        self.extra = extra or {}

    def response_headers(self) -> dict[str, str] | None:
        """HTTP headers the API sends with this problem."""
        return None

    def problem(self) -> dict[str, Any]:
        return problem_body(
            self.status, self.code, self.title, self.detail, self.errors, self.extra
        )


class InvalidManifest(TierpointError):
    code = "invalid_manifest"
    status = 422
    title = "Invalid checkpoint manifest"


class InvalidJobName(TierpointError):
    code = "invalid_job_name"
    status = 422
    title = "Invalid job name"


class UnsafePath(TierpointError, ValueError):
    """A path or name that could leave its tier root or is not portable across tiers. Raised by
    path validation and by every store; a ValueError too, so pydantic validators may raise it."""

    code = "unsafe_path"
    status = 422
    title = "Unsafe shard path"


class UnknownNode(TierpointError):
    code = "unknown_node"
    status = 422
    title = "Unknown or lost node"


class NodeNotFound(TierpointError):
    code = "node_not_found"
    status = 404
    title = "Node not found"


class UnknownTier(TierpointError):
    code = "unknown_tier"
    status = 422
    title = "Unknown tier"

    @classmethod
    def named(cls, tier: str, configured: Sequence[str], location: str = "query") -> UnknownTier:
        """The one refusal of a tier that is not configured, wherever it was named."""
        return cls(
            f"tier {tier!r} is not configured; tiers are {', '.join(configured)}",
            errors=[
                {
                    "field": "tier",
                    "location": location,
                    "message": f"unknown tier {tier!r}",
                    "code": cls.code,
                }
            ],
        )


class RequestInvalid(TierpointError):
    code = "validation_error"
    status = 422
    title = "Invalid request"


class ManifestTooLarge(TierpointError):
    code = "manifest_too_large"
    status = 413
    title = "Manifest too large"


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


class NotReady(TierpointError):
    code = "not_ready"
    status = 503
    title = "Service not ready"


class CatalogUnavailable(TierpointError):
    code = "catalog_unavailable"
    status = 503
    title = "Catalog unavailable"


class InvalidPolicy(TierpointError):
    code = "invalid_policy"
    status = 422
    title = "Invalid retention policy"


class PolicyNotFound(TierpointError):
    code = "policy_not_found"
    status = 404
    title = "Retention policy not found"


class PolicyExists(TierpointError):
    code = "policy_exists"
    status = 409
    title = "A retention policy with this name exists"


class PolicyInUse(TierpointError):
    code = "policy_in_use"
    status = 409
    title = "Retention policy in use"


class PolicyConflict(TierpointError):
    code = "policy_conflict"
    status = 409
    title = "Concurrent change of the default policy"


class NotLeasable(TierpointError):
    code = "not_leasable"
    status = 409
    title = "Checkpoint cannot be leased"


class LeaseNotFound(TierpointError):
    code = "lease_not_found"
    status = 404
    title = "Restore lease not found"


class TierCopyNotFound(TierpointError):
    code = "tier_copy_not_found"
    status = 404
    title = "No copy on that tier"


class CopyExpiring(TierpointError):
    code = "copy_expiring"
    status = 409
    title = "The copy is being expired"


class RequestTooLarge(TierpointError):
    code = "request_too_large"
    status = 413
    title = "Request too large"


class LeaseEnded(TierpointError):
    code = "lease_ended"
    status = 409
    title = "Restore lease already released or expired"


class TierNeedsRestoreRequest(TierpointError):
    code = "tier_needs_restore_request"
    status = 409
    title = "Tier's objects need an S3 restore request before they can be read"


class CopyNotFound(TierpointError):
    code = "copy_not_found"
    status = 404
    title = "No such copy of the checkpoint"


class InvalidDataPath(TierpointError):
    """A node data endpoint request whose path is not `/v1/data/<tier>/<job>/<step>/<path>`
    under the manifest's path rules."""

    code = "invalid_data_path"
    status = 400
    title = "Not a data endpoint path"


class RangeNotSatisfiable(TierpointError):
    code = "range_not_satisfiable"
    status = 416
    title = "Range not satisfiable"


class CopyDamaged(TierpointError):
    """A node data endpoint found the copy it was asked for not the registered size (or gone):
    it serves none of it, marks it bad and asks for its repair."""

    code = "copy_damaged"
    status = 404
    title = "The copy on this node is damaged"


class ReconcileNotFound(TierpointError):
    code = "reconcile_not_found"
    status = 404
    title = "No such reconciliation run"


class TemporalUnavailable(TierpointError):
    code = "temporal_unavailable"
    status = 503
    title = "Temporal unavailable"


class NothingToRetry(TierpointError):
    code = "nothing_to_retry"
    status = 409
    title = "Nothing to retry"


class NoVerifiedSource(TierpointError):
    """A retry whose lifecycle run could never finish: a tier it must copy from holds no verified
    copy any more (expired by retention, lost, corrupt)."""

    code = "no_verified_source"
    status = 409
    title = "No verified copy left to retry from"


class CopyOnLostNode(TierpointError):
    """A retry that cannot help: the failed copy is on a tier local to a node declared lost, whose
    bytes no run can read or write again (the checkpoint's other tiers still serve restores)."""

    code = "copy_on_lost_node"
    status = 409
    title = "The failed copy was on a node declared lost"


class RepairInProgress(TierpointError):
    """A retry while a repair (or a re-replication) is copying the failed copy back: the repair
    promotes it when done, and a second run would copy the same shards beside it."""

    code = "repair_in_progress"
    status = 409
    title = "A repair is copying this copy back"


class CheckpointProtected(TierpointError):
    code = "checkpoint_protected"
    status = 409
    title = "Checkpoint pinned, leased or in flight"


class CheckpointBeingDeleted(TierpointError):
    code = "checkpoint_being_deleted"
    status = 409
    title = "The checkpoint at this step is still being deleted"


class FilterRequired(TierpointError):
    """An acknowledgement of many failures that names none: acknowledging every failure at once
    takes a filter that says so."""

    code = "filter_required"
    status = 422
    title = "Say which failures"


class NothingToAcknowledge(TierpointError):
    code = "nothing_to_acknowledge"
    status = 409
    title = "No unacknowledged failure"


class StepOutOfRange(TierpointError):
    code = "step_out_of_range"
    status = 422
    title = "Step out of range"


class SizeOutOfRange(TierpointError):
    """A shard size or a checkpoint's total over 2^53 - 1 bytes (raised through the manifest's
    validation; declared here so the code is part of the contract)."""

    code = "size_out_of_range"
    status = 422
    title = "Size out of range"


class NothingToVerify(TierpointError):
    code = "nothing_to_verify"
    status = 409
    title = "Nothing to verify"


class Unauthenticated(TierpointError):
    """401: no bearer token. RFC 6750 asks for a `WWW-Authenticate: Bearer` challenge."""

    code = "missing_token"
    status = 401
    title = "Authentication required"
    bearer_error: ClassVar[str | None] = None

    def response_headers(self) -> dict[str, str] | None:
        challenge = 'Bearer realm="tierpoint"'
        if self.bearer_error is not None:
            challenge += f', error="{self.bearer_error}"'
        return {"WWW-Authenticate": challenge}


class InvalidToken(Unauthenticated):
    code = "invalid_token"
    title = "Invalid token"
    bearer_error = "invalid_token"


class TokenExpired(InvalidToken):
    code = "token_expired"
    title = "Token expired"


class TokenRevoked(InvalidToken):
    code = "token_revoked"
    title = "Token revoked"


class InsufficientScope(TierpointError):
    code = "insufficient_scope"
    status = 403
    title = "Token scope too small"

    def __init__(self, detail: str, *, required: str) -> None:
        super().__init__(detail, extra={"required_scope": required})
        self.required = required

    def response_headers(self) -> dict[str, str] | None:
        return {
            "WWW-Authenticate": 'Bearer realm="tierpoint", error="insufficient_scope", '
            f'scope="{self.required}"'
        }


class InvalidScope(TierpointError):
    code = "invalid_scope"
    status = 422
    title = "Invalid token scope"


class TokenNotFound(TierpointError):
    code = "token_not_found"
    status = 404
    title = "Token not found"


class TokenExists(TierpointError):
    code = "token_exists"
    status = 409
    title = "A token with this name exists"


# A run's timeline (docs/timeline.md): rollbacks, forks, lineage and verdicts.


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


ALL_ERRORS: tuple[type[TierpointError], ...] = (
    InvalidManifest,
    InvalidJobName,
    UnsafePath,
    UnknownNode,
    NodeNotFound,
    UnknownTier,
    RequestInvalid,
    ManifestTooLarge,
    CheckpointConflict,
    CheckpointNotFound,
    JobNotFound,
    NoRestorableCheckpoint,
    NotReady,
    CatalogUnavailable,
    InvalidPolicy,
    PolicyNotFound,
    PolicyExists,
    PolicyInUse,
    PolicyConflict,
    NotLeasable,
    LeaseNotFound,
    LeaseEnded,
    TierNeedsRestoreRequest,
    TierCopyNotFound,
    CopyExpiring,
    RequestTooLarge,
    TemporalUnavailable,
    NothingToRetry,
    NoVerifiedSource,
    CheckpointProtected,
    CheckpointBeingDeleted,
    NothingToAcknowledge,
    StepOutOfRange,
    SizeOutOfRange,
    Unauthenticated,
    InvalidToken,
    TokenExpired,
    TokenRevoked,
    InsufficientScope,
    InvalidScope,
    TokenNotFound,
    TokenExists,
    CopyNotFound,
    InvalidDataPath,
    RangeNotSatisfiable,
    CopyDamaged,
    ReconcileNotFound,
    RollbackConflict,
    CheckpointSuperseded,
    NotRestorable,
    RollbackToFuture,
    BranchNotFound,
    BranchSuperseded,
    VerdictConflict,
    LineageCycle,
    UnknownParent,
    JobExists,
)
