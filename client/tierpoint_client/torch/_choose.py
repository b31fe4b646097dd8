"""Which checkpoint a load reads, as its coordinator asks the server: the latest restorable one
of the job's timeline, a given step, the newest of a branch, or the newest certified good; the
next older one when the chosen one's `.metadata` has no verified copy left; and, for a load that
rolls back, the branch the run then saves on."""

from __future__ import annotations

import os
import pickle
import threading
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from torch.distributed.checkpoint.metadata import Metadata

from tierpoint_client.client import Client
from tierpoint_client.errors import (
    ConflictError,
    NotFoundError,
    NoVerifiedCopyError,
    TierpointError,
)
from tierpoint_client.models import Checkpoint, RestoreStart, TierInfo
from tierpoint_client.timeline import Branch, Branches, CheckpointRef, Loaded
from tierpoint_client.torch._copies import CheckpointFiles
from tierpoint_client.torch._files import METADATA_FILE, stored_items

# The sources of a checkpoint's files as the reader reads them (its `_files`).
FilesOf = Callable[[Checkpoint, Sequence[TierInfo]], CheckpointFiles]
T = TypeVar("T")


@dataclass(frozen=True)
class Choice:
    """What a load asks for (`TierpointReader`'s options)."""

    job: str
    step: int | None
    branch: int | None
    health: Literal["good"] | None
    tier: str | None
    node: str | None
    lease_ttl: int

    def __post_init__(self) -> None:
        if self.step is not None and (self.branch is not None or self.health is not None):
            raise ValueError(
                "a step names the checkpoint of the job's timeline: give `step`, or `branch` "
                "and/or `health`, not both"
            )
        if self.health not in (None, "good"):
            raise ValueError(f"health={self.health!r}: only 'good' is asked for")

    def describe(self) -> str:
        """How a message names what was asked for."""
        parts = [f"job {self.job!r}"]
        if self.branch is not None:
            parts.append(f"branch {self.branch}")
        if self.health is not None:
            parts.append(f"certified {self.health}")
        if self.tier is not None:
            parts.append(f"on tier {self.tier!r}")
        return ", ".join(parts)


@dataclass
class Chosen:
    step: int
    metadata: Metadata
    # This rank's sources: the coordinator's from the whole checkpoint; another rank's from what
    # the coordinator sent with its load plan (None until then).
    files: CheckpointFiles | None
    # The load's one lease, held by the coordinator alone (None on the other ranks, and once
    # released).
    lease_id: int | None
    # The coordinator's answer from the server: every file's copies, for every rank's plan.
    start: RestoreStart | None = None
    # The coordinator's `.metadata` as read and verified (kept on its node once recorded).
    metadata_bytes: bytes = b""
    # Which checkpoint it is and its writer's metadata; the branch the run saves on after it.
    loaded: Loaded | None = None
    branch: Branch | None = None


def choose(
    client: Client, choice: Choice, owner: str, files_of: FilesOf, *, rollback: bool
) -> Chosen | None:
    """The coordinator's one request: step, lease and every copy; then `.metadata`, or (without
    `step` or `branch`) the next older step when no copy of it verifies; then the branch the run
    saves on (rolled back to the step with `rollback`). None: nothing restorable.

    The job's branches are asked for beside the start, not after `.metadata`: the load waits for
    one round trip instead of two, and the branch is still the one current when it began."""
    branches = _beside(client.branches, choice.job)
    try:
        found = start(client, choice, choice.step, owner)
    except NotFoundError as e:
        if e.code != "job_not_found" or choice.step is not None:
            raise
        found = None  # a job that never saved: its first run
    if found is None:
        return None
    chosen = _read_metadata(client, choice, found, owner, files_of)
    try:
        assert chosen.loaded is not None
        chosen.branch = save_branch(
            client, choice.job, chosen.loaded.ref, rollback=rollback, listed=branches
        )
    except BaseException:
        client.release_lease(found.job, chosen.step, found.lease.id)
        chosen.lease_id = None
        raise
    return chosen


def _read_metadata(
    client: Client, choice: Choice, found: RestoreStart, owner: str, files_of: FilesOf
) -> Chosen:
    while True:
        try:
            files = files_of(found.checkpoint, found.tiers)
            raw = files.read_all(METADATA_FILE)
            metadata = pickle.loads(raw)
            if not isinstance(metadata, Metadata):
                raise TierpointError(
                    f"{found.job}/{found.step}: {METADATA_FILE} is not DCP metadata"
                )
            cp = found.checkpoint
            metadata.storage_data = _items(metadata, cp)
            loaded = Loaded(cp.ref, dict(cp.metadata))
            return Chosen(found.step, metadata, files, found.lease.id, found, raw, loaded)
        except NoVerifiedCopyError as e:
            client.release_lease(found.job, found.step, found.lease.id)
            if choice.step is not None or choice.branch is not None:
                raise
            before = older(client, choice, found.step, owner)
            if before is None:
                raise
            warnings.warn(
                f"tierpoint: {e}; loading the next older restorable step {before.step} instead",
                stacklevel=3,
            )
            found = before


def _items(metadata: Metadata, cp: Checkpoint) -> dict[Any, Any]:
    """The items' records as the reader reads them; those a save by URL wrote before it
    recorded them as TierpointWriter does take their file's node, size and crc32c from the
    catalog (every byte is verified against the catalog's crc32c anyway)."""
    shards = {s.path: s for s in cp.shards or ()}
    where = f"{cp.job}/{cp.step}"

    def file_of(name: str) -> tuple[str, int, str]:
        shard = shards.get(name)
        if shard is None:
            raise TierpointError(f"{where}: {METADATA_FILE} names {name!r}, not a file of it")
        return shard.node, shard.size, shard.crc32c or ""

    return stored_items(metadata.storage_data, file_of, where)


def start(client: Client, choice: Choice, step: int | None, owner: str) -> RestoreStart | None:
    """One request: the step (`step`, or as `choice` says), a lease on it, every copy."""
    # The node counts only where the server chooses the step (a given step needs no node).
    node = choice.node if step is None else None
    if step is not None:
        return client.start_restore(
            choice.job, choice.lease_ttl, step=step, tier=choice.tier, owner=owner
        )
    return client.start_restore(
        choice.job,
        choice.lease_ttl,
        tier=choice.tier,
        node=node,
        owner=owner,
        branch=choice.branch,
        health=choice.health,
    )


def older(client: Client, choice: Choice, step: int, owner: str) -> RestoreStart | None:
    """The newest restorable step of the job's timeline before `step` that `choice` accepts and
    can still be leased, started. Superseded checkpoints are not on the timeline; with
    `health="good"` only certified ones count."""
    steps = sorted(
        (
            cp.step
            for cp in client.checkpoints(choice.job, state="restorable", tier=choice.tier)
            if cp.step < step and cp.superseded_by is None and _accepted(cp, choice)
        ),
        reverse=True,
    )
    for candidate in steps:
        try:
            return start(client, choice, candidate, owner)
        except ConflictError:
            continue  # expired or quarantined since it was listed
    return None


def _accepted(cp: Checkpoint, choice: Choice) -> bool:
    return choice.health is None or (cp.health is not None and cp.health.verdict == "good")


def save_branch(
    client: Client,
    job: str,
    loaded: CheckpointRef,
    *,
    rollback: bool,
    listed: Future[Branches] | None = None,
) -> Branch | None:
    """The branch a run that loaded `loaded` saves on: the job's current one (as `listed`, the
    job's branches asked for already, says; else asked now); with `rollback`, when the job's
    timeline goes on past `loaded`, the branch that a rollback to it starts (the steps after it
    superseded, so the run saves them again). None: a job that has no branch yet (a fork's
    first load), which saves on its first."""
    try:
        branches = listed.result() if listed is not None else client.branches(job)
    except NotFoundError:
        return None
    current = next(b for b in branches.items if b.number == branches.current)
    if not rollback or loaded.job != job or not _timeline_after(client, job, loaded.step):
        return current
    done = client.rollback(
        job,
        loaded.step,
        from_branch=branches.current,
        reason=f"a load of step {loaded.step} that rolls back (TierpointReader(rollback=True))",
    )
    return done.branch


def _timeline_after(client: Client, job: str, step: int) -> bool:
    """Whether the job's timeline holds a checkpoint after `step`, in any state: one that a
    save of the steps after `step` would collide with."""
    for cp in client.checkpoints(job):  # newest first
        if cp.superseded_by is None:
            return cp.step > step
    return False


_requests: ThreadPoolExecutor | None = None
_requests_lock = threading.Lock()


def _forget_requests() -> None:
    """In a forked child, which has none of its parent's threads: a pool of its own, made when
    first used, and a new lock (a parent's thread may have held this one at the fork)."""
    global _requests, _requests_lock
    _requests, _requests_lock = None, threading.Lock()


# guard: fork-forgets-api-pool
os.register_at_fork(after_in_child=_forget_requests)


def _beside(call: Callable[[str], T], arg: str) -> Future[T]:
    """`call(arg)` on a thread of this process's own, for a request whose answer the load needs
    only later."""
    global _requests
    with _requests_lock:
        if _requests is None:
            _requests = ThreadPoolExecutor(2, "tierpoint-api")
        return _requests.submit(call, arg)
