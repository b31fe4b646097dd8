"""The catalog == tiers check holds on a consistent checkpoint and fails on each way the catalog
and the tiers can disagree: it is what the fault tests lean on, so it must be able to fail."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.lifecycle import new_job, random_shards, seed_checkpoint
from tests.helpers.services import NODES, Services, s3_client
from tierpoint.catalog.models import Checkpoint, Node, Replica, Shard, TierCopy
from tierpoint.config import Settings
from tierpoint.storage.paths import partial_name
from tierpoint.tier_config import TierConfig, TierKind

TIERS = ("ssd", "lustre", "s3")


def test_catalog_matches_tiers_check_catches_each_disagreement(
    settings: Settings, services: Services, engine: Engine, sessions: sessionmaker[Session]
) -> None:
    shards = random_shards(NODES, 1, 50_000)
    seeded = seed_checkpoint(settings, sessions, new_job(), 1, shards)
    job, cp = seeded.job, seeded.checkpoint_id
    s3_tier = settings.tier("s3")
    bucket = s3_tier.bucket
    assert bucket is not None
    s3 = s3_client(services)
    lustre_dir = settings.tier("lustre").root_for(None) / job / "1"
    ssd = settings.tier("ssd")
    keys = {sh.path: f"{s3_tier.prefix}{job}/1/{sh.path}" for sh in shards}
    for sh in shards:
        f = lustre_dir / sh.path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(sh.data)
        s3.put_object(Bucket=bucket, Key=keys[sh.path], Body=sh.data)
    with sessions.begin() as s:
        ids = dict(s.execute(select(Shard.path, Shard.id).where(Shard.checkpoint_id == cp)).all())
        job_id = s.scalar(select(Checkpoint.job_id).where(Checkpoint.id == cp))
        rows = []
        for sh in shards:
            where = {
                "ssd": (sh.node, str(ssd.root_for(sh.node) / job / "1" / sh.path)),
                "lustre": (None, str(lustre_dir / sh.path)),
                "s3": (None, f"s3://{bucket}/{keys[sh.path]}"),
            }
            for tier, (node, location) in where.items():
                rows.append(
                    {
                        "shard_id": ids[sh.path],
                        "checkpoint_id": cp,
                        "tier": tier,
                        "node_id": node,
                        "state": "verified",
                        "location": location,
                        "bytes_done": len(sh.data),
                    }
                )
        s.execute(insert(Replica), rows)
        s.execute(
            insert(TierCopy),
            [
                {"checkpoint_id": cp, "tier": t, "job_id": job_id, "step": 1, "state": "restorable"}
                for t in TIERS
            ],
        )

    checked = assert_catalog_matches_tiers(settings, engine, [cp])
    assert checked.verified == dict.fromkeys(TIERS, 2)
    assert checked.restorable == dict.fromkeys(TIERS, 1)

    first = shards[0]
    lustre_file = lustre_dir / first.path
    ssd_file = ssd.root_for(first.node) / job / "1" / first.path
    assert first.node == NODES[0]

    def fails(match: str, spoil: Callable[[], object], mend: Callable[[], object]) -> None:
        spoil()
        try:
            with pytest.raises(AssertionError, match=match):
                assert_catalog_matches_tiers(settings, engine, [cp])
        finally:
            mend()
        assert_catalog_matches_tiers(settings, engine, [cp])

    def set_replica(tier: str, **values: object) -> None:
        with sessions.begin() as s:
            s.execute(
                update(Replica)
                .where(Replica.shard_id == ids[first.path], Replica.tier == tier)
                .values(**values)
            )

    flipped = bytes([first.data[0] ^ 1]) + first.data[1:]
    fails(
        "lustre: .* crc32c differs",
        lambda: lustre_file.write_bytes(flipped),
        lambda: lustre_file.write_bytes(first.data),
    )
    fails(
        "ssd: .* holds",
        lambda: ssd_file.write_bytes(first.data[:-1]),
        lambda: ssd_file.write_bytes(first.data),
    )
    fails(
        "ssd: .* is missing",
        lambda: ssd_file.unlink(),
        lambda: ssd_file.write_bytes(first.data),
    )
    fails(
        "s3: .* has no object",
        lambda: s3.delete_object(Bucket=bucket, Key=keys[first.path]),
        lambda: s3.put_object(Bucket=bucket, Key=keys[first.path], Body=first.data),
    )
    fails(
        "s3: .* crc32c differs",
        lambda: s3.put_object(Bucket=bucket, Key=keys[first.path], Body=flipped),
        lambda: s3.put_object(Bucket=bucket, Key=keys[first.path], Body=first.data),
    )
    partial = lustre_file.with_name(partial_name(lustre_file.name))
    fails("lustre: temp files left", lambda: partial.write_bytes(b"x"), partial.unlink)
    upload: dict[str, str] = {}

    def start_upload() -> None:
        upload.update(s3.create_multipart_upload(Bucket=bucket, Key=keys[first.path]))

    fails(
        "s3: multipart uploads left",
        start_upload,
        lambda: s3.abort_multipart_upload(
            Bucket=bucket, Key=keys[first.path], UploadId=upload["UploadId"]
        ),
    )
    fails(
        "restorable on s3 without verified replicas of 1 shard",
        lambda: set_replica("s3", state="copying"),
        lambda: set_replica("s3", state="verified"),
    )
    moved = str(Path(str(lustre_file) + ".elsewhere"))
    fails(
        "lustre: .* recorded at",
        lambda: set_replica("lustre", location=moved),
        lambda: set_replica("lustre", location=str(lustre_file)),
    )
    fails(
        "ssd: .* verified on node",
        lambda: set_replica("ssd", node_id=NODES[1]),
        lambda: set_replica("ssd", node_id=NODES[0]),
    )


def test_the_check_reads_peer_copies_on_their_holders(
    settings: Settings, engine: Engine, sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """A peer copy is checked under its holder's peer root (not its shard's node's, not a shared
    root), and only on a holder other than the shard's node and not declared lost."""
    ssd = settings.tier("ssd")
    peer = TierConfig(name="peer", kind=TierKind.PEER, root=str(tmp_path / "nodes/{node}/peer"))
    cfg = Settings.model_validate({**settings.model_dump(), "tiers": [ssd, peer]})
    shards = random_shards(NODES, 1, 30_000)
    seeded = seed_checkpoint(cfg, sessions, new_job(), 1, shards)
    job, cp = seeded.job, seeded.checkpoint_id
    holder = {NODES[0]: NODES[1], NODES[1]: NODES[0]}
    with sessions.begin() as s:
        ids = dict(s.execute(select(Shard.path, Shard.id).where(Shard.checkpoint_id == cp)).all())
        job_id = s.scalar(select(Checkpoint.job_id).where(Checkpoint.id == cp))
        rows = []
        for sh in shards:
            held = peer.root_for(holder[sh.node]) / job / "1" / sh.path
            held.parent.mkdir(parents=True, exist_ok=True)
            held.write_bytes(sh.data)
            where = {
                "ssd": (sh.node, ssd.root_for(sh.node) / job / "1" / sh.path),
                "peer": (holder[sh.node], held),
            }
            rows += [
                {
                    "shard_id": ids[sh.path],
                    "checkpoint_id": cp,
                    "tier": tier,
                    "node_id": node,
                    "state": "verified",
                    "location": str(location),
                    "bytes_done": len(sh.data),
                }
                for tier, (node, location) in where.items()
            ]
        s.execute(insert(Replica), rows)
        s.execute(
            insert(TierCopy),
            [
                {"checkpoint_id": cp, "tier": t, "job_id": job_id, "step": 1, "state": "restorable"}
                for t in ("ssd", "peer")
            ],
        )
    checked = assert_catalog_matches_tiers(cfg, engine, [cp])
    assert checked.verified == {"ssd": 2, "peer": 2} and checked.restorable["peer"] == 1

    first = shards[0]
    held = peer.root_for(holder[first.node]) / job / "1" / first.path

    def fails(match: str, spoil: Callable[[], object], mend: Callable[[], object]) -> None:
        spoil()
        try:
            with pytest.raises(AssertionError, match=match):
                assert_catalog_matches_tiers(cfg, engine, [cp])
        finally:
            mend()
        assert_catalog_matches_tiers(cfg, engine, [cp])

    def set_peer(**values: object) -> None:
        with sessions.begin() as s:
            s.execute(
                update(Replica)
                .where(Replica.shard_id == ids[first.path], Replica.tier == "peer")
                .values(**values)
            )

    def set_lost(at: object) -> None:
        with sessions.begin() as s:
            s.execute(update(Node).where(Node.id == holder[first.node]).values(lost_at=at))

    flipped = bytes([first.data[0] ^ 1]) + first.data[1:]
    fails(
        "peer: .* crc32c differs",
        lambda: held.write_bytes(flipped),
        lambda: held.write_bytes(first.data),
    )
    fails("peer: .* is missing", held.unlink, lambda: held.write_bytes(first.data))
    fails(
        f"peer: .* of node {first.node} verified on holder {first.node}",
        lambda: set_peer(node_id=first.node),
        lambda: set_peer(node_id=holder[first.node]),
    )
    fails("peer: .* verified on lost node", lambda: set_lost(func.now()), lambda: set_lost(None))
    partial = held.with_name(partial_name(held.name))
    fails("peer: temp files left", lambda: partial.write_bytes(b"x"), partial.unlink)
