"""Catalog == tiers: what the catalog claims about a checkpoint is what its tiers hold.

Read off the tiers directly (files opened by path, objects fetched with a boto3 client of our
own), never through tierpoint's stores, so that a bug in a store cannot vouch for itself.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import crc32c
from sqlalchemy import Engine, and_, select

from tierpoint.catalog.models import Checkpoint, Job, Node, Replica, Shard, TierCopy
from tierpoint.config import Settings
from tierpoint.states import ReplicaState, TierState
from tierpoint.storage.paths import PARTIAL_SUFFIX
from tierpoint.tier_config import TierConfig, TierKind


@dataclass
class Consistency:
    """What was checked: verified replicas per tier, restorable markers per tier."""

    verified: Counter[str] = field(default_factory=Counter)
    restorable: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class _Verified:
    checkpoint_id: int
    job: str
    step: int
    shard_id: int
    path: str
    size: int
    checksum: str | None
    tier: str
    node: str | None
    shard_node: str
    location: str
    key_layout: str | None  # the checkpoint's copy on the tier: flat (None) or spread-N


def _s3(tier: TierConfig) -> Any:
    # Credentials come from the standard chain, as the product's clients take them.
    return boto3.client("s3", endpoint_url=tier.endpoint_url, region_name=tier.region)


def _crc_hex(data: bytes) -> str:
    return f"{crc32c.crc32c(data):08x}"


def _posix_dir(tier: TierConfig, node: str | None, job: str, step: int) -> Path:
    """The checkpoint's directory on a POSIX tier: under the node's root for a local tier, the
    holder's for a peer tier (its replica's node), the one root of a shared tier."""
    return tier.root_for(node if tier.on_nodes else None) / job / str(step)


def _check_posix(tier: TierConfig, r: _Verified) -> None:
    expected = _posix_dir(tier, r.node, r.job, r.step).joinpath(*r.path.split("/"))
    assert r.location == str(expected), f"{r.tier}: {r.path} recorded at {r.location}"
    try:
        data = expected.read_bytes()
    except FileNotFoundError:
        raise AssertionError(f"{r.tier}: verified {r.path} is missing at {expected}") from None
    assert len(data) == r.size, f"{r.tier}: {r.path} holds {len(data)} of {r.size} bytes"
    assert _crc_hex(data) == r.checksum, f"{r.tier}: {r.path} crc32c differs from the catalog's"


def _key(tier: TierConfig, job: str, step: int, path: str, layout: str | None) -> str:
    """The object's key, restated from the rule in docs/scale.md (not taken from the stores)."""
    spread = ""
    if layout is not None and layout.startswith("spread-"):
        n = int(layout.removeprefix("spread-"))
        digest = hashlib.sha256(f"{job}/{step}/{path}".encode()).digest()
        spread = f"_{int.from_bytes(digest[:8], 'big') % n:0{len(f'{n - 1:x}')}x}/"
    return f"{tier.prefix}{spread}{job}/{step}/{path}"


def _check_s3(tier: TierConfig, s3: Any, r: _Verified) -> None:
    key = _key(tier, r.job, r.step, r.path, r.key_layout)
    assert r.location == f"s3://{tier.bucket}/{key}", f"{r.tier}: {r.path} at {r.location}"
    try:
        obj = s3.get_object(Bucket=tier.bucket, Key=key, ChecksumMode="ENABLED")
    except s3.exceptions.NoSuchKey:
        raise AssertionError(f"{r.tier}: verified {r.path} has no object {key}") from None
    data = obj["Body"].read()
    assert len(data) == r.size, f"{r.tier}: {key} holds {len(data)} of {r.size} bytes"
    assert _crc_hex(data) == r.checksum, f"{r.tier}: {key} crc32c differs from the catalog's"


def _no_leftovers_posix(tier: TierConfig, nodes: set[str | None], job: str, step: int) -> None:
    """A restorable POSIX tier holds no temp file of a copy under the checkpoint."""
    for node in nodes:
        top = _posix_dir(tier, node, job, step)
        for dirpath, _, files in os.walk(top):
            partial = [f for f in files if f.endswith(PARTIAL_SUFFIX)]
            assert not partial, f"{tier.name}: temp files left in {dirpath}: {partial}"


def _no_leftovers_s3(tier: TierConfig, s3: Any, job: str, step: int, layout: str | None) -> None:
    """A restorable S3 tier holds no multipart upload under the checkpoint's prefix (any of its
    prefixes with spread keys)."""
    spread = layout is not None and layout.startswith("spread-")
    prefix = tier.prefix if spread else f"{tier.prefix}{job}/{step}/"
    resp = s3.list_multipart_uploads(Bucket=tier.bucket, Prefix=prefix)
    mine = f"{job}/{step}/"
    uploads = [
        (u["Key"], u["UploadId"])
        for u in resp.get("Uploads", [])
        if not spread or u["Key"][len(tier.prefix) :].partition("/")[2].startswith(mine)
    ]
    assert not uploads, f"{tier.name}: multipart uploads left behind: {uploads}"


def assert_catalog_matches_tiers(
    settings: Settings, engine: Engine, checkpoint_ids: Collection[int]
) -> Consistency:
    """Every `verified` replica of these checkpoints is on its tier, at its recorded location
    (a peer copy under its holder's peer root, a node other than the shard's and not lost),
    with the registered size and crc32c; every `restorable` marker has each of the checkpoint's
    shards verified on that tier, and nothing half-written (temp file, multipart upload) left
    under the checkpoint there. Returns what it checked, so a caller can tell it was not empty."""
    ids = list(checkpoint_ids)
    assert ids, "no checkpoint to check"
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                Checkpoint.id,
                Job.name,
                Checkpoint.step,
                Shard.id,
                Shard.path,
                Shard.size,
                Shard.checksum,
                Replica.tier,
                Replica.node_id,
                Shard.node_id,
                Replica.location,
                TierCopy.key_layout,
            )
            .join(Job, Job.id == Checkpoint.job_id)
            .join(Shard, Shard.checkpoint_id == Checkpoint.id)
            .join(Replica, Replica.shard_id == Shard.id)
            .outerjoin(
                TierCopy,
                and_(
                    TierCopy.checkpoint_id == Checkpoint.id,
                    TierCopy.tier == Replica.tier,
                ),
            )
            .where(Checkpoint.id.in_(ids), Replica.state == ReplicaState.VERIFIED.value)
            .order_by(Checkpoint.id, Shard.ordinal, Replica.tier)
        ).all()
        verified = [_Verified(*tuple(row)) for row in rows]
        shards: dict[int, set[int]] = {}
        where: dict[int, tuple[str, int]] = {}
        for cp_id, job, step, shard_id in conn.execute(
            select(Checkpoint.id, Job.name, Checkpoint.step, Shard.id)
            .join(Job, Job.id == Checkpoint.job_id)
            .join(Shard, Shard.checkpoint_id == Checkpoint.id)
            .where(Checkpoint.id.in_(ids))
        ):
            shards.setdefault(cp_id, set()).add(shard_id)
            where[cp_id] = (job, step)
        lost = set(conn.scalars(select(Node.id).where(Node.lost_at.is_not(None))))
        markers = conn.execute(
            select(TierCopy.checkpoint_id, TierCopy.tier, TierCopy.key_layout).where(
                TierCopy.checkpoint_id.in_(ids),
                TierCopy.state == TierState.RESTORABLE.value,
            )
        ).all()

    out = Consistency()
    clients: dict[str, Any] = {}
    for r in verified:
        tier = settings.tier(r.tier)
        assert r.checksum, f"{r.tier}: {r.path} verified without a checksum"
        if tier.kind is TierKind.S3:
            s3 = clients.setdefault(tier.name, _s3(tier))
            _check_s3(tier, s3, r)
        else:
            if tier.kind is TierKind.LOCAL:
                assert r.node == r.shard_node, f"{r.tier}: {r.path} verified on node {r.node}"
            if tier.kind is TierKind.PEER:
                # On another node's device, one not declared lost (those copies are `lost`).
                assert r.node is not None and r.node != r.shard_node, (
                    f"{r.tier}: {r.path} of node {r.shard_node} verified on holder {r.node}"
                )
                assert r.node not in lost, f"{r.tier}: {r.path} verified on lost node {r.node}"
            _check_posix(tier, r)
        out.verified[r.tier] += 1

    for cp_id, tier_name, layout in markers:
        on_tier = {r.shard_id for r in verified if r.checkpoint_id == cp_id and r.tier == tier_name}
        missing = shards.get(cp_id, set()) - on_tier
        assert shards.get(cp_id) and not missing, (
            f"checkpoint {cp_id} restorable on {tier_name} without verified replicas of "
            f"{len(missing)} shard(s)"
        )
        job, step = where[cp_id]
        tier = settings.tier(tier_name)
        if tier.kind is TierKind.S3:
            _no_leftovers_s3(tier, clients.setdefault(tier.name, _s3(tier)), job, step, layout)
        else:
            nodes = {r.node for r in verified if r.checkpoint_id == cp_id and r.tier == tier_name}
            _no_leftovers_posix(tier, nodes, job, step)
        out.restorable[tier_name] += 1
    return out


def assert_nothing_lost(
    settings: Settings,
    engine: Engine,
    kept: dict[int, Collection[str]],
) -> Consistency:
    """No byte of a kept checkpoint was lost: each checkpoint in `kept` is restorable on each of
    the tiers given for it, and the catalog agrees with every tier (so those tiers hold every
    shard with its registered size and crc32c, which the tests register from the bytes they
    wrote)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(TierCopy.checkpoint_id, TierCopy.tier).where(
                TierCopy.checkpoint_id.in_(list(kept)),
                TierCopy.state == TierState.RESTORABLE.value,
            )
        ).all()
    restorable: dict[int, set[str]] = {}
    for cp, tier in rows:
        restorable.setdefault(cp, set()).add(tier)
    for cp, tiers in kept.items():
        missing = set(tiers) - restorable.get(cp, set())
        assert not missing, f"checkpoint {cp} is not restorable on {sorted(missing)}"
    return assert_catalog_matches_tiers(settings, engine, list(kept))
