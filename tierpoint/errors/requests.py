"""A request the API refuses as bad input (invariant 6): a manifest, a name, a path, a
number or a body outside the rules; a node or tier nobody configured."""

from __future__ import annotations

from collections.abc import Sequence

from tierpoint.errors.base import TierpointError


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


class TierNotCoded(TierpointError):
    code = "tier_not_coded"
    status = 422
    title = "Not a coded tier"

    @classmethod
    def named(cls, tier: str, location: str = "path") -> TierNotCoded:
        return cls(
            f"tier {tier!r} keeps whole copies, not stripes",
            errors=[
                {
                    "field": "tier",
                    "location": location,
                    "message": f"tier {tier!r} has no code",
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


class RequestTooLarge(TierpointError):
    code = "request_too_large"
    status = 413
    title = "Request too large"


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


class FilterRequired(TierpointError):
    """An acknowledgement of many failures that names none: acknowledging every failure at once
    takes a filter that says so."""

    code = "filter_required"
    status = 422
    title = "Say which failures"
