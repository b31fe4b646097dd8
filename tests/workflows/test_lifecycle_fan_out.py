"""The lifecycle's copies fan out from the sealed tier (workflows/checkpoint_lifecycle.py): every
later tier copies from the node's verified local copy at once, so S3 neither waits for the shared
tier's copy nor fails with it. On real services: Temporal dev server with the real workers,
Postgres, moto S3, real files.

The shared tier here refuses the copy as it refuses any path that leaves its root: someone with
write access to the shared file system replaced the job's directory with a symlink to a directory
of their own. Nothing is written through the link, the shared tier's copy fails, and the S3 copy,
made from the node's copy, is verified and promoted all the same."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from tests.helpers.lifecycle import (
    NODES,
    markers,
    new_job,
    random_shards,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
)
from tests.helpers.services import Services, s3_client
from tests.workflows.test_checkpoint_lifecycle import events, replica_states
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleStatus


async def test_a_shared_tier_that_refuses_the_copy_does_not_hold_s3_back(
    settings: Settings,
    services: Services,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
) -> None:
    job = new_job()
    shards = random_shards(NODES, 2, 40_000)
    elsewhere = tmp_path / "not-the-tier"
    elsewhere.mkdir()
    lustre_root = settings.tier("lustre").root_for(None)
    lustre_root.mkdir(parents=True, exist_ok=True)
    (lustre_root / job).symlink_to(elsewhere, target_is_directory=True)
    seeded = seed_checkpoint(settings, sessions, job, 3, shards)

    async with running_workers(settings, client):
        result, handle = await run_lifecycle(client, seeded)
        status = await handle.query("status", result_type=LifecycleStatus)

    outcome = {t.tier: (t.state, t.reason or "") for t in result.tiers}
    assert [t.tier for t in result.tiers] == ["ssd", "lustre", "s3"], result
    assert outcome["ssd"][0] == "restorable", outcome
    assert outcome["lustre"][0] == "failed", outcome
    assert "symlink" in outcome["lustre"][1], outcome
    # Before the fan-out: ("failed", "source tier lustre failed").
    assert outcome["s3"] == ("restorable", ""), outcome
    assert sorted(status.tiers_done) == ["s3", "ssd"] and status.tiers_failed == ["lustre"]

    marks = {t: st for t, (st, _) in markers(sessions, seeded.checkpoint_id).items()}
    assert marks == {"ssd": "restorable", "lustre": "failed", "s3": "restorable"}, marks
    states = replica_states(sessions, seeded.checkpoint_id)
    assert {states[(sh.path, "s3")] for sh in shards} == {"verified"}, states
    assert not any(elsewhere.iterdir()), "a copy was written through the symlink"
    s3 = s3_client(services)
    tier = settings.tier("s3")
    for sh in shards:
        key = f"{tier.prefix}{job}/{seeded.step}/{sh.path}"
        assert s3.get_object(Bucket=tier.bucket, Key=key)["Body"].read() == sh.data, sh.path
    # The S3 copy read the nodes' local copies, one batch per node.
    copied = [d for k, t, d in events(sessions, seeded.checkpoint_id) if (k, t) == ("copied", "s3")]
    assert sorted(d["node"] for d in copied) == sorted(NODES), copied
    assert {d["source"] for d in copied} == {"ssd"}, copied
