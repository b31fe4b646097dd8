"""The tierpoint REST API as the training side calls it: one method per request, its JSON as the
client's models (`models/`), its errors as the client's (`errors.py`); nothing else."""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar
from urllib.parse import quote

from tierpoint_client.errors import AuthError, NotFoundError
from tierpoint_client.models import (
    Checkpoint,
    LatestCheckpoint,
    Lease,
    RestoreStart,
    ShardSpec,
    TierInfo,
)
from tierpoint_client.paths import check_no_path_conflict
from tierpoint_client.timeline import CheckpointRef
from tierpoint_client.timeline_api import TimelineApi
from tierpoint_client.transport import ApiTls, RetryPolicy, Transport

A = TypeVar("A", bound="Api")


def _job(job: str) -> str:
    return quote(job, safe="")


class Api(TimelineApi):
    """The API's requests (a run's timeline's in `TimelineApi`). Thread-safe: every call opens
    its own HTTP request. `Client` adds what takes more than one request, or work on this
    machine (hashing, restoring)."""

    def __init__(
        self,
        api_url: str,
        token: str | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        tls: ApiTls | None = None,
    ) -> None:
        """`tls`: how an https API is trusted (its CA, a client certificate for mutual TLS);
        by default TIERPOINT_API_TLS_CA, TIERPOINT_API_TLS_CLIENT_CERT and _KEY, else the
        system's roots."""
        self._http = Transport(api_url, token, timeout, retry or RetryPolicy(), tls)

    @property
    def token(self) -> str | None:
        """The bearer token this client sends; restores also send it to peers' data endpoints."""
        return self._http.token

    @classmethod
    def from_env(cls: type[A], **kwargs: Any) -> A:
        """From TIERPOINT_API_URL and TIERPOINT_TOKEN (as `tierpoint dev` writes to stack.env)."""
        url = os.environ.get("TIERPOINT_API_URL")
        if not url:
            raise ValueError("TIERPOINT_API_URL is not set")
        return cls(url, token=os.environ.get("TIERPOINT_TOKEN") or None, **kwargs)

    def register_manifest(
        self,
        job: str,
        step: int,
        shards: Sequence[ShardSpec | Mapping[str, Any]],
        metadata: Mapping[str, Any] | None = None,
        *,
        branch: int | None = None,
        parent: CheckpointRef | None = None,
        provenance: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Register shards whose sizes and checksums the caller already has (e.g. computed while
        writing). Entries are ShardSpec or dicts with path, size, crc32c (or None), node.

        `branch`: the branch the run saves on (None: the job's current one; a branch a rollback
        has left since, ConflictError `branch_superseded`). `parent`: the checkpoint the run had
        loaded (None: the step before it on the job's timeline). `provenance`: `config_hash`,
        `code_version`, `data_cursor`.

        Manifests gathered from several nodes are checked here for paths that cannot all be
        files (`a` on one node, `a/b` on another): ManifestError, before any request."""
        entries = [_shard_json(s) for s in shards]
        check_no_path_conflict(e["path"] for e in entries if isinstance(e["path"], str))
        body: dict[str, Any] = {
            "step": step,
            "shards": entries,
            "metadata": dict(metadata or {}),
        }
        if branch is not None:
            body["branch"] = int(branch)
        if parent is not None:
            body["parent"] = parent.to_json()
        if provenance is not None:
            body["provenance"] = dict(provenance)
        resp = self._http.request("POST", f"/v1/jobs/{_job(job)}/checkpoints", body=body)
        result: dict[str, Any] = resp.body
        return result

    def authorize_registration(self, job: str) -> None:
        """Raises AuthError unless the token may register checkpoints of `job`. The API answers
        by the registration route's own rule (`GET .../access`), so the check cannot drift from
        it; nothing is written."""
        resp = self._http.request("GET", f"/v1/jobs/{_job(job)}/access")
        access: dict[str, Any] = resp.body
        if access.get("register") is True:
            return
        raise AuthError(
            403,
            "insufficient_scope",
            f"token {access.get('token')!r} may not do this: register checkpoints of job "
            f"{job!r}; it needs train:<a prefix of {job!r}> (or admin)",
            {"required_scope": f"train:{job}"},
        )

    def checkpoint(self, job: str, step: int, *, branch: int | None = None) -> Checkpoint:
        """One checkpoint with its per-tier state and per-shard replicas: the one at `step` on
        the job's timeline (else the newest superseded one), or the one saved on `branch`."""
        resp = self._http.request(
            "GET", f"/v1/jobs/{_job(job)}/checkpoints/{int(step)}", query={"branch": branch}
        )
        return Checkpoint.from_json(resp.body)

    def checkpoints(
        self,
        job: str,
        *,
        state: str | None = None,
        tier: str | None = None,
        page_size: int | None = None,
    ) -> Iterator[Checkpoint]:
        """Every checkpoint of the job (optionally in `state` on `tier`), following pagination."""
        cursor: str | None = None
        while True:
            resp = self._http.request(
                "GET",
                f"/v1/jobs/{_job(job)}/checkpoints",
                query={"state": state, "tier": tier, "limit": page_size, "cursor": cursor},
            )
            for item in resp.body["items"]:
                yield Checkpoint.from_json(item)
            cursor = resp.body.get("next_cursor")
            if not cursor:
                return

    def latest(
        self,
        job: str,
        tier: str | None = None,
        node: str | None = None,
        *,
        lease_ttl: int | None = None,
        owner: str | None = None,
        holder: str | None = None,
        branch: int | None = None,
        health: Literal["good"] | None = None,
    ) -> LatestCheckpoint | None:
        """The newest restorable checkpoint with its restore plan, or None if there is none.

        The newest of the job's timeline (never a superseded checkpoint); with `branch`, of that
        branch's own timeline; with `health="good"`, the newest certified good, walking back
        across tiers and branches.

        `tier` restricts the answer to copies on that tier; `node` lets the local copies on that
        node count (pass this node's id when restarting on the same machine). With `lease_ttl`
        (seconds) the answer carries a restore lease on the chosen checkpoint, taken in the same
        transaction (`owner`: who takes it, free text): release it with `release_lease` when the
        restore is done. (`holder`: `owner`'s earlier name, deprecated.)
        """
        owner = _owner(owner, holder)
        try:
            resp = self._http.request(
                "GET",
                f"/v1/jobs/{_job(job)}/checkpoints/latest",
                query={
                    "tier": tier,
                    "node": node,
                    "lease_ttl": lease_ttl,
                    "holder": owner,
                    "branch": branch,
                    "health": health,
                },
            )
        except NotFoundError as e:
            if e.code == "no_restorable_checkpoint":
                return None
            raise
        return dataclasses.replace(LatestCheckpoint.from_json(resp.body), tier=tier)

    def start_restore(
        self,
        job: str,
        lease_ttl: int,
        *,
        step: int | None = None,
        tier: str | None = None,
        node: str | None = None,
        owner: str | None = None,
        holder: str | None = None,
        branch: int | None = None,
        health: Literal["good"] | None = None,
    ) -> RestoreStart | None:
        """One request for all a reader needs: the checkpoint (at `step`, on `branch` when
        given; or the latest restorable one, chosen as `latest(tier, node, branch, health)`
        chooses it), a restore lease of `lease_ttl` seconds on it (release it with
        `release_lease`), and the checkpoint with every copy of every file and the tiers. A
        forked job with no restorable checkpoint of its own answers its fork parent's
        (`fork_parent`; `job`, `step` and `branch` are the parent's). None when no step is
        restorable; ConflictError `not_leasable` when `step` is restorable from no tier.
        `owner`: who takes the lease, free text (`holder`: its earlier name, deprecated)."""
        owner = _owner(owner, holder)
        if step is not None and health is not None:
            raise ValueError("give `step` (and `branch`) or `health`, not both")
        body: dict[str, Any] = {"ttl_seconds": lease_ttl}
        fields = (
            ("step", step),
            ("branch", branch),
            ("health", health),
            ("tier", tier),
            ("node", node),
            ("holder", owner),
        )
        body.update((key, value) for key, value in fields if value is not None)
        try:
            resp = self._http.request("POST", f"/v1/jobs/{_job(job)}/restores", body=body)
        except NotFoundError as e:
            if e.code == "no_restorable_checkpoint":
                return None
            raise
        return RestoreStart.from_json(resp.body)

    def create_lease(
        self,
        job: str,
        step: int,
        ttl_seconds: int,
        owner: str | None = None,
        *,
        holder: str | None = None,
    ) -> Lease:
        """A restore lease on one checkpoint, taken by `owner` (free text; `holder`: its earlier
        name, deprecated). ConflictError `not_leasable` when it is restorable from no tier."""
        owner = _owner(owner, holder)
        body: dict[str, Any] = {"ttl_seconds": ttl_seconds}
        if owner is not None:
            body["holder"] = owner  # the wire keeps the field's first name
        resp = self._http.request(
            "POST", f"/v1/jobs/{_job(job)}/checkpoints/{int(step)}/leases", body=body
        )
        return Lease.from_json(resp.body)

    def renew_lease(self, job: str, step: int, lease_id: int, ttl_seconds: int) -> Lease:
        """Make a lease end `ttl_seconds` from now; ConflictError `lease_ended` when it was
        released or has expired (take a new one)."""
        resp = self._http.request(
            "PUT",
            f"/v1/jobs/{_job(job)}/checkpoints/{int(step)}/leases/{int(lease_id)}",
            body={"ttl_seconds": ttl_seconds},
        )
        return Lease.from_json(resp.body)

    def release_lease(self, job: str, step: int, lease_id: int) -> None:
        """Release a restore lease; releasing an ended lease again is fine."""
        self._http.request(
            "DELETE", f"/v1/jobs/{_job(job)}/checkpoints/{int(step)}/leases/{int(lease_id)}"
        )

    def purge(self, job: str, step: int) -> dict[str, Any]:
        """Ask for one of the job's checkpoints to be deleted (a trainer's purge of an old step):
        its copies go through retention's expiry. ConflictError `checkpoint_protected` while it
        is pinned, held by a restore lease, in flight, or the job's newest restorable one."""
        resp = self._http.request("POST", f"/v1/jobs/{_job(job)}/checkpoints/{int(step)}/purge")
        result: dict[str, Any] = resp.body
        return result

    def quarantine(self, job: str, step: int, reason: str, tier: str | None = None) -> Checkpoint:
        """Take a checkpoint (or only its copy on `tier`) out of `latest()`: call it when loading
        it failed or the loss diverged right after loading; the next `latest()` serves the next
        best one and names this one in `skipped`. Retention keeps it as evidence. Safe to repeat.
        Returns the checkpoint's new state."""
        body: dict[str, Any] = {"reason": reason}
        if tier is not None:
            body["tier"] = tier
        resp = self._http.request(
            "POST", f"/v1/jobs/{_job(job)}/checkpoints/{int(step)}/quarantine", body=body
        )
        return Checkpoint.from_json(resp.body)

    def lift_quarantine(self, job: str, step: int, tier: str | None = None) -> Checkpoint:
        """Lift the quarantine of the checkpoint (or of its copy on `tier`); lifting one that is
        not there changes nothing. Returns the checkpoint's new state."""
        resp = self._http.request(
            "DELETE",
            f"/v1/jobs/{_job(job)}/checkpoints/{int(step)}/quarantine",
            query={"tier": tier},
        )
        return Checkpoint.from_json(resp.body)

    def report_corrupt_copy(
        self,
        job: str,
        step: int,
        tier: str,
        path: str,
        reason: str,
        *,
        branch: int | None = None,
        stripe: int | None = None,
    ) -> dict[str, Any]:
        """Tell the server that the copy of shard `path` on `tier` did not match its registered
        checksum when read. The server reads that copy back itself; if it confirms the mismatch it
        marks the copy corrupt, stops offering that tier and repairs it from another tier.
        Returns what happened (`replica_state`, `marker_state`, `repair`, `verification`);
        reporting the same copy again changes nothing. `branch`: the checkpoint read was saved
        at `step` on that branch (without it: the one on the job's timeline). `stripe`: on a
        coded tier, the index of the stripe that did not match its crc32c; its holder reads it
        back, and a confirmed mismatch takes it out of the set's count."""
        body: dict[str, Any] = {"tier": tier, "path": path, "reason": reason}
        if stripe is not None:
            body["stripe"] = stripe
        resp = self._http.request(
            "POST",
            f"/v1/jobs/{_job(job)}/checkpoints/{int(step)}/corrupt-copies",
            query={"branch": branch},
            body=body,
        )
        answer: dict[str, Any] = resp.body
        return answer

    def record_cached_copies(
        self,
        job: str,
        step: int,
        tier: str,
        copies: Mapping[str, Iterable[str]],
        *,
        branch: int | None = None,
    ) -> dict[str, set[str]]:
        """Before readers keep files of the checkpoint on their nodes' local `tier` (node ->
        paths: files the catalog holds no copy of there), record them, so that the copy's expiry
        on that tier deletes them. Returns node -> the paths recorded, the only ones a reader may
        keep (a node's own files and a copy being expired are left out). One request for all.
        `branch`: the checkpoint read was saved at `step` on that branch."""
        body = {
            "tier": tier,
            "copies": [{"node": n, "paths": sorted(set(p))} for n, p in sorted(copies.items())],
        }
        resp = self._http.request(
            "POST",
            f"/v1/jobs/{_job(job)}/checkpoints/{int(step)}/cached-copies",
            query={"branch": branch},
            body=body,
        )
        return {c["node"]: set(c["paths"]) for c in resp.body["copies"]}

    def tiers(self) -> list[TierInfo]:
        resp = self._http.request("GET", "/v1/tiers")
        return [TierInfo.from_json(t) for t in resp.body]


def _shard_json(shard: ShardSpec | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(shard, ShardSpec):
        return shard.to_json()
    return {
        "path": shard["path"],
        "size": shard["size"],
        "crc32c": shard.get("crc32c"),
        "node": shard["node"],
    }


def _owner(owner: str | None, holder: str | None) -> str | None:
    """A lease's owner, given by its name or by `holder`, the name it had before the peer tier's
    holders took that word."""
    if holder is None:
        return owner
    warnings.warn("`holder=` is now `owner=`", DeprecationWarning, stacklevel=3)
    if owner is not None and owner != holder:
        raise TypeError("give a lease's owner once: `owner=` (or the deprecated `holder=`)")
    return holder
