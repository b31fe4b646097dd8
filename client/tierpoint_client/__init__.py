"""tierpoint-client: the training side of tierpoint.

client = Client("http://tierpoint:8080", token=...)
client.register(job, step, "/nvme/ckpt/<job>/<step>", node="node-a")
client.restore(job, "/nvme/restore", node="node-a")
"""

import warnings
from typing import Any

from tierpoint_client._version import __version__
from tierpoint_client.client import Client
from tierpoint_client.errors import (
    ApiError,
    AuthError,
    CheckpointFailedError,
    ChecksumMismatchError,
    ConflictError,
    DestinationError,
    DestinationNotEmptyError,
    InvalidJobNameError,
    InvalidRequestError,
    ManifestError,
    MissingCredentialsError,
    MissingDependencyError,
    NotFoundError,
    NoVerifiedCopyError,
    RestoreInterrupted,
    SaveMismatchError,
    ServerError,
    SourceError,
    TierpointError,
    TransportError,
    UnsafePathError,
)
from tierpoint_client.hashing import file_crc32c, hash_files
from tierpoint_client.manifest import build_manifest
from tierpoint_client.models import (
    Checkpoint,
    LatestCheckpoint,
    Lease,
    PlanEntry,
    Progress,
    Replica,
    RestoredFile,
    RestoreResult,
    RestoreStart,
    Shard,
    ShardSpec,
    Skipped,
    TierCopy,
    TierInfo,
)
from tierpoint_client.paths import safe_join, validate_job_name, validate_relative_path
from tierpoint_client.timeline import (
    Branch,
    Branches,
    CheckpointRef,
    Fork,
    Health,
    Lineage,
    LineageNode,
    Loaded,
    Rollback,
    Verdict,
)
from tierpoint_client.transport import ApiTls, RetryPolicy

__all__ = [
    "ApiError",
    "ApiTls",
    "AuthError",
    "Branch",
    "Branches",
    "Checkpoint",
    "CheckpointFailedError",
    "CheckpointRef",
    "ChecksumMismatchError",
    "Client",
    "ConflictError",
    "DestinationError",
    "DestinationNotEmptyError",
    "Fork",
    "Health",
    "InvalidJobNameError",
    "InvalidRequestError",
    "LatestCheckpoint",
    "Lease",
    "Lineage",
    "LineageNode",
    "Loaded",
    "ManifestError",
    "MissingCredentialsError",
    "MissingDependencyError",
    "NoVerifiedCopyError",
    "NotFoundError",
    "PlanEntry",
    "Progress",
    "Replica",
    "RestoreInterrupted",
    "RestoreResult",
    "RestoreStart",
    "RestoredFile",
    "RetryPolicy",
    "Rollback",
    "SaveMismatchError",
    "ServerError",
    "Shard",
    "ShardSpec",
    "Skipped",
    "SourceError",
    "TierCopy",
    "TierInfo",
    "TierpointError",
    "TransportError",
    "UnsafePathError",
    "Verdict",
    "__version__",
    "build_manifest",
    "file_crc32c",
    "hash_files",
    "safe_join",
    "validate_job_name",
    "validate_relative_path",
]


def __getattr__(name: str) -> Any:
    # TierCopy was called TierState, the name the server gives its state enum: the old name
    # still imports, with a warning, for code written against it.
    if name == "TierState":
        warnings.warn(
            "tierpoint_client.TierState is now TierCopy", DeprecationWarning, stacklevel=2
        )
        return TierCopy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
