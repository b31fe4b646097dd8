"""Bit rot behind tierpoint's back: one bit of a promoted S3 object and one of a shared-tier file
change after promotion. The scrub reads every verified replica back, finds both, marks them
corrupt and demotes their tiers in the same transaction (latest restorable stops offering s3 and
lustre), and repair re-copies each from the fastest tier that still holds it verified, then
re-promotes: the bytes are right again and the catalog agrees with every tier.

Repair of these shards runs on their node's queue (the fastest good copy is on the node's ssd),
so with only the shared worker running the damage stays visible; node workers then let it heal.
"""

from __future__ import annotations

from temporalio.client import Client

from api.app import create_app
from tests.helpers.api import running_client
from tests.helpers.consistency import assert_catalog_matches_tiers
from tests.helpers.faults import marker_states
from tests.helpers.integrity import (
    events,
    flip_file,
    flip_s3,
    integrity_settings,
    promoted,
    repair_result,
    replica_states,
    run_scrub,
    s3_key,
)
from tests.helpers.lifecycle import record_history, recording_histories, running_workers
from tests.helpers.services import Services, s3_client
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.config import Settings
from tierpoint.contract.integrity import repair_workflow_id


async def test_scrub_finds_bit_rot_demotes_repairs_and_repromotes(
    settings: Settings, services: Services, client: Client
) -> None:
    cfg = integrity_settings(settings)
    engine = make_sync_engine(cfg.database_url, pool_size=2)
    try:
        seeded = await promoted(cfg, client, engine)
        job, step, cp = seeded.job, seeded.step, seeded.checkpoint_id
        on_s3, on_lustre = seeded.shards[0], seeded.shards[3]
        s3 = s3_client(services)
        flip_s3(cfg, s3, seeded, on_s3)
        flip_file(cfg, "lustre", seeded, on_lustre)

        async for api in running_client(create_app(cfg)):
            async with running_workers(cfg, client, nodes=()):
                result = await run_scrub(client, f"scrub-test/{job}")
                assert result.corrupt == 2, result
                assert result.replicas == 2 * len(seeded.shards) - 2, result
                # Demoted in the transaction that marked the replicas: nothing offers them now.
                states = marker_states(engine, cp)
                assert states == {"ssd": "restorable", "lustre": "failed", "s3": "failed"}
                replicas = replica_states(engine, cp)
                assert replicas[("s3", on_s3.path)] == "corrupt"
                assert replicas[("lustre", on_lustre.path)] == "corrupt"
                for tier in ("lustre", "s3"):
                    r = await api.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": tier})
                    assert r.status_code == 404, r.text
                r = await api.get("/v1/scrub")
                assert r.status_code == 200, r.text
                totals = {t["tier"]: t for t in r.json()["tiers"]}
                assert totals["s3"]["corrupt"] == totals["lustre"]["corrupt"] == 1
                assert totals["s3"]["replicas"] == len(seeded.shards) - 1
                assert totals["s3"]["last_scrubbed_at"] is not None
                assert totals["ssd"]["replicas"] == 0
                kinds = [(k, t) for k, t, _ in events(engine, cp, "corrupt")]
                assert sorted(kinds) == [("corrupt", "lustre"), ("corrupt", "s3")]
                assert all(d["marker_demoted"] for _, _, d in events(engine, cp, "corrupt"))

            # Node workers come: the repair (requested by the scrub) copies from each node's ssd.
            async with running_workers(cfg, client):
                repaired = await repair_result(client, seeded)
                if recording_histories():
                    await record_history(client, repair_workflow_id(job, step), "repair_two_tiers")
                    await record_history(client, f"scrub-test/{job}", "scrub_finds_corrupt")
                    await record_history(client, f"scrub-test/{job}/s3/all", "scrub_unit_s3")
            assert {t.tier: t.state for t in repaired.tiers} == {
                "lustre": "restorable",
                "s3": "restorable",
            }, repaired
            assert marker_states(engine, cp) == dict.fromkeys(("ssd", "lustre", "s3"), "restorable")
            body = s3.get_object(Bucket=cfg.tier("s3").bucket, Key=s3_key(cfg, seeded, on_s3))
            assert body["Body"].read() == on_s3.data
            kinds = [(k, t) for k, t, _ in events(engine, cp, "corrupt", "repaired", "promoted")]
            for tier in ("lustre", "s3"):
                mine = [k for k, t in kinds if t == tier]
                assert mine == ["promoted", "corrupt", "repaired", "promoted"], kinds
            repairs = [d for k, t, d in events(engine, cp, "repaired")]
            assert all(d["sources"] == {"ssd": 1} for d in repairs), repairs
            for tier in ("lustre", "s3"):
                r = await api.get(f"/v1/jobs/{job}/checkpoints/latest", params={"tier": tier})
                assert r.status_code == 200, r.text
            r = await api.get(f"/v1/jobs/{job}/checkpoints/{step}")
            shown = [rep for s in r.json()["shards"] for rep in s["replicas"]]
            # Read back good by the scrub: the s3 and lustre replicas it did not find bad.
            assert sum(1 for rep in shown if rep["scrubbed_at"]) == 2 * len(seeded.shards) - 2
        checked = assert_catalog_matches_tiers(cfg, engine, [cp])
        assert checked.verified == dict.fromkeys(("ssd", "lustre", "s3"), len(seeded.shards))
        assert checked.restorable == dict.fromkeys(("ssd", "lustre", "s3"), 1)
    finally:
        engine.dispose()
