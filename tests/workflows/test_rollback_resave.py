"""A run rolls back and saves its steps again: the re-saved step never shares a file with the
one it supersedes, on any tier the server names (the local tier's directory, a peer copy on
another node, the shared tier, the S3 key), and both stay restorable: the new one as latest, the
superseded one by branch.

Before branches, the second save of a step was refused (409 `checkpoint_conflict`), and an
admin's delete followed by a save at the same paths was the data loss "Nothing lost on the peer
tier and around deletes" tells of. A rollback makes re-saving the common case, so each branch
after the first keeps its checkpoints in `<job>/<step>.b<branch>/` on every tier.

Real API (uvicorn), real node and shared workers, Postgres, Temporal and moto; the job writes its
files to its nodes' local tier and registers over HTTP as a training job does.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.faults import db_now, workers_reported_in
from tests.helpers.lifecycle import crc_hex, running_workers
from tests.helpers.services import Services, s3_client
from tests.helpers.tokens import bearer, create_token
from tierpoint.config import Settings
from tierpoint.tier_config import TierConfig, TierKind

NODES = ("node-a", "node-b")
SIZE = 32 * 1024 + 3
WAIT = 300.0  # hang guard only


@pytest.fixture
def peer_settings(settings: Settings, tmp_path: Path) -> Settings:
    """ssd -> peer -> lustre -> s3: each node's copy is held by the other node."""
    ssd, *rest = settings.tiers
    peer = TierConfig(name="peer", kind=TierKind.PEER, root=str(tmp_path / "nodes/{node}/peer"))
    for node in NODES:
        (tmp_path / "nodes" / node / "ssd").mkdir(parents=True, exist_ok=True)
    return Settings.model_validate(
        {**settings.model_dump(), "tiers": [ssd, peer, *rest], "data_token": "tp_worker-rb"}
    )


def step_files(settings: Settings, tier: str, node: str | None, job: str, where: str) -> Path:
    return settings.tier(tier).root_for(node) / job / where


def write(settings: Settings, job: str, where: str, files: dict[str, bytes]) -> list[Any]:
    """What each node of the job does: write its file under the checkpoint's directory on its
    local tier (`where`: the step, or `<step>.b<branch>` as the branch's `step_dir` says)."""
    shards = []
    for node, data in files.items():
        f = step_files(settings, "ssd", node, job, where) / f"{node}.bin"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
        shards.append(
            {"path": f"{node}.bin", "size": len(data), "crc32c": crc_hex(data), "node": node}
        )
    return shards


async def restorable(
    http: httpx.AsyncClient, job: str, step: int, tiers: list[str], **q: Any
) -> None:
    async with asyncio.timeout(WAIT):
        while True:
            r = await http.get(f"/v1/jobs/{job}/checkpoints/{step}", params={"shards": False, **q})
            assert r.status_code == 200, r.text
            states = {t["tier"]: t["state"] for t in r.json()["tiers"]}
            assert "failed" not in states.values(), r.json()
            if all(states[t] == "restorable" for t in tiers):
                return
            await asyncio.sleep(0.2)


async def test_a_step_saved_again_after_a_rollback_has_its_own_files_on_every_tier(
    peer_settings: Settings, client: Client, services: Services, engine: Any, tmp_path: Path
) -> None:
    settings = peer_settings
    tiers = settings.tier_names()
    job = f"resave-{uuid.uuid4().hex[:10]}"
    train = create_token(settings.database_url, scopes=[f"train:{job}"])
    first = {n: os.urandom(SIZE) for n in NODES}
    old = {n: os.urandom(SIZE) for n in NODES}
    new = {n: os.urandom(SIZE) for n in NODES}
    since = db_now(engine)
    async with (
        running_workers(settings, client, nodes=NODES),
        serving(create_app(settings)) as api,
        httpx.AsyncClient(base_url=api, headers=bearer(train)) as http,
    ):
        await workers_reported_in(engine, NODES, since)
        for step, files in ((10, first), (20, old)):
            body = {"step": step, "shards": write(settings, job, str(step), files)}
            r = await http.post(f"/v1/jobs/{job}/checkpoints", json=body)
            assert r.status_code == 201, r.text
            await restorable(http, job, step, tiers)

        r = await http.post(f"/v1/jobs/{job}/rollback", json={"step": 10, "from_branch": 1})
        assert r.status_code == 201, r.text
        branch = r.json()["branch"]
        where = branch["step_dir"].format(step=20)
        assert where == "20.b2"
        body = {"step": 20, "branch": branch["number"], "shards": write(settings, job, where, new)}
        r = await http.post(f"/v1/jobs/{job}/checkpoints", json=body)
        assert r.status_code == 201, r.text
        await restorable(http, job, 20, tiers)

        latest = (await http.get(f"/v1/jobs/{job}/checkpoints/latest")).json()
        assert (latest["step"], latest["checkpoint"]["branch"]) == (20, 2)
        assert all("/20.b2/" in e["location"] for e in latest["plan"]), latest["plan"]
        # The superseded step keeps its copies, restorable by branch.
        left = await http.get(f"/v1/jobs/{job}/checkpoints/20", params={"branch": 1})
        assert left.json()["superseded_by"] == 2
        assert {t["tier"]: t["state"] for t in left.json()["tiers"]} == dict.fromkeys(
            tiers, "restorable"
        )
        restored = await asyncio.to_thread(
            TierpointClient(api, token=train).restore, job, tmp_path / "restore", tier="s3"
        )
        assert restored.step == 20

    holder = {"node-a": "node-b", "node-b": "node-a"}
    s3 = s3_client(services)
    s3_tier = settings.tier("s3")
    for node in NODES:
        name = f"{node}.bin"
        for tier, on in (("ssd", node), ("peer", holder[node]), ("lustre", None)):
            assert (step_files(settings, tier, on, job, "20") / name).read_bytes() == old[node]
            assert (step_files(settings, tier, on, job, "20.b2") / name).read_bytes() == new[node]
        for where, data in (("20", old[node]), ("20.b2", new[node])):
            key = f"{s3_tier.prefix}{job}/{where}/{name}"
            assert s3.get_object(Bucket=s3_tier.bucket, Key=key)["Body"].read() == data, key
