"""The training-side client: register checkpoints, ask for the latest restorable one, restore it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from tierpoint_client.api import Api
from tierpoint_client.destination import Existing, check_destination
from tierpoint_client.errors import CheckpointFailedError, NotFoundError
from tierpoint_client.leases import RESTORE_LEASE_TTL, owner
from tierpoint_client.manifest import PathLike, build_manifest
from tierpoint_client.models import Checkpoint, LatestCheckpoint, RestoreResult
from tierpoint_client.paths import validate_relative_path
from tierpoint_client.restore import ProgressCallback, restore_latest

# Tier states from which a checkpoint will not (again) become restorable without an operator.
_TERMINAL_STATES = frozenset({"failed", "expiring", "expired"})


class Client(Api):
    """A tierpoint API client (`Api`, every request) with the training side's work: register a
    directory's files, wait for a copy, restore a checkpoint into a directory. Thread-safe."""

    def register(
        self,
        job: str,
        step: int,
        directory: PathLike,
        node: str,
        metadata: Mapping[str, Any] | None = None,
        files: Iterable[PathLike] | None = None,
        workers: int = 8,
    ) -> dict[str, Any]:
        """Hash the checkpoint's shards and register them; returns the Checkpoint JSON.

        `directory` is this node's local-tier copy of the checkpoint (<local root>/<job>/<step>/);
        every file under it is a shard unless `files` lists them (relative to it, or absolute
        inside it). Safe to call again after a crash or timeout: the same manifest answers 200
        with the existing checkpoint; a different one raises ConflictError.
        """
        shards = build_manifest(directory, node, files=files, workers=workers)
        return self.register_manifest(job, step, shards, metadata=metadata)

    def wait_restorable(
        self,
        job: str,
        step: int,
        tier: str,
        timeout: float = 600.0,
        poll: float = 0.5,
    ) -> Checkpoint:
        """Poll until the checkpoint is restorable on `tier`.

        Raises CheckpointFailedError as soon as the tier's copy failed or is being expired, and
        TimeoutError (with the last seen state) when `timeout` seconds pass first.
        """
        deadline = time.monotonic() + timeout
        while True:
            cp = self.checkpoint(job, step)
            state = cp.tier(tier)
            if state is not None:
                if state.state == "restorable":
                    return cp
                if state.state in _TERMINAL_STATES:
                    raise CheckpointFailedError(job, step, tier, state.state, state.reason)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                seen = state.state if state is not None else "absent"
                raise TimeoutError(
                    f"{job}/{step} not restorable on {tier} after {timeout}s (state: {seen})"
                )
            time.sleep(min(poll, remaining))

    # -- restore ------------------------------------------------------------------------------

    def restore(
        self,
        job: str,
        dest_dir: PathLike,
        *,
        node: str | None = None,
        tier: str | None = None,
        workers: int = 4,
        progress: ProgressCallback | None = None,
        existing: Existing = "refuse",
        lease_ttl: int = RESTORE_LEASE_TTL,
    ) -> RestoreResult:
        """Restore the latest restorable checkpoint into dest_dir/<shard path>.

        One request chooses the checkpoint, the fastest verified copy of each shard and takes a
        restore lease on it (`latest(lease_ttl=...)`), held as `restore_checkpoint` says. Each
        shard (a POSIX path, a peer's data endpoint, or an S3 object read with the standard AWS
        credential chain) is staged in dest_dir and checked against its registered size and
        crc32c; a copy that cannot be read or does not match (reported to the server) gives way
        to the shard's next verified copy. Only when every shard is verified are they moved to
        their names: a restore that fails or is interrupted leaves dest_dir as it was.
        NoVerifiedCopyError when no copy of a shard could be read (each copy and why),
        NotFoundError when nothing is restorable.

        dest_dir must be empty or absent, unless `existing` is "overwrite" (the checkpoint's
        files replace those of the same name, other entries stay) or "clean" (every other entry
        is removed once the checkpoint is verified). `progress(bytes_done, bytes_total)` is
        called from the copying threads.
        """
        check_destination(dest_dir, existing)
        latest = self.latest(job, tier=tier, node=node, lease_ttl=lease_ttl, owner=owner())
        if latest is None:
            raise NotFoundError(
                404,
                "no_restorable_checkpoint",
                f"job {job!r} has no restorable checkpoint"
                + (f" on tier {tier!r}" if tier else "")
                + (f" for node {node!r}" if node else ""),
            )
        return self.restore_checkpoint(
            latest,
            dest_dir,
            workers=workers,
            progress=progress,
            node=node,
            tier=tier,
            existing=existing,
            lease_ttl=lease_ttl,
        )

    def restore_checkpoint(
        self,
        latest: LatestCheckpoint,
        dest_dir: PathLike,
        *,
        workers: int = 4,
        progress: ProgressCallback | None = None,
        node: str | None = None,
        tier: str | None = None,
        existing: Existing = "refuse",
        lease_ttl: int = RESTORE_LEASE_TTL,
    ) -> RestoreResult:
        """Restore a plan obtained from `latest()` (e.g. after inspecting it), as `restore` does.

        The restore holds the lease `latest` carries (asked for with `lease_ttl`), or takes one
        (ConflictError `not_leasable` when the checkpoint is no longer restorable), renews it
        every third of `lease_ttl` seconds while it runs and releases it when it ends, however it
        ends. A shard whose copy cannot be read or does not match is read from another verified
        copy of it on a restorable tier (a local one only on `node`); with `tier` (the restore
        was asked for that tier only; by default the tier `latest` was asked for) there is no
        other copy to read, and NoVerifiedCopyError says why that one failed."""
        # guard: restore-tier-only
        tier = tier if tier is not None else latest.tier
        for entry in latest.plan:
            validate_relative_path(entry.path)
        return restore_latest(
            self,
            latest,
            dest_dir,
            workers=workers,
            progress=progress,
            node=node,
            tier=tier,
            existing=existing,
            lease_ttl=lease_ttl,
        )
