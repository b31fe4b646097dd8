"""A copy damaged on the destination after it was written and before it was read back (one byte
flipped in the shared-tier file, as a lost write or a bad disk would) is never taken for a copy:
the read-back catches it, the shard is written again from its verified source and read back
again, and only then is it verified; the checkpoint ends restorable everywhere with the original
bytes, and the copy's event says what was rewritten and why.

The hook is real and needs nothing of ours changed: the shared tier's read bandwidth limit slows
the node worker's read-back (16 MiB at 4 MiB/s, ~4 s), so the file sits under its final name,
complete, while the read-back has not reached its last byte. The test flips that last byte as
soon as the file appears. Had the read-back already passed it, the replica would be verified
over a wrong byte and the checks below fail saying so."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import crc32c
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from tests.helpers.consistency import assert_nothing_lost
from tests.helpers.faults import OVERALL_TIMEOUT, marker_states
from tests.helpers.lifecycle import (
    NODES,
    ShardSpec,
    crc_hex,
    new_job,
    running_workers,
    seed_checkpoint,
    shard_file,
)
from tierpoint.catalog.models import Event, Replica
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import LifecycleInput, LifecycleResult, workflow_id
from tierpoint.temporal import start_lifecycle

SHARD = "big.bin"
SHARD_SIZE = 16 * 1024 * 1024
READ_BACK_LIMIT = 4 * 1024 * 1024
FAST_POLL = 0.01


def lustre_state(engine: Engine, checkpoint_id: int) -> str | None:
    with engine.connect() as conn:
        state = conn.scalar(
            select(Replica.state).where(
                Replica.checkpoint_id == checkpoint_id, Replica.tier == "lustre"
            )
        )
    return None if state is None else str(state)


def flip_last_byte(path: Path) -> None:
    with path.open("r+b") as f:
        f.seek(-1, os.SEEK_END)
        byte = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())


def file_crc(path: Path) -> str | None:
    try:
        return f"{crc32c.crc32c(path.read_bytes()):08x}"
    except FileNotFoundError:
        return None


async def test_copy_damaged_before_its_read_back_is_rewritten_never_promoted(
    settings: Settings, engine: Engine, sessions: sessionmaker[Session], client: Client
) -> None:
    slow_lustre = settings.tier("lustre").model_copy(
        update={"read_bandwidth_limit": READ_BACK_LIMIT}
    )
    node_cfg = settings.model_copy(
        update={"tiers": [t if t.name != "lustre" else slow_lustre for t in settings.tiers]}
    )
    data = os.urandom(SHARD_SIZE)
    good = crc_hex(data)
    seeded = seed_checkpoint(
        settings, sessions, new_job(), 3, [ShardSpec(NODES[0], SHARD, data, good)]
    )
    cp, job, step = seeded.checkpoint_id, seeded.job, seeded.step
    final = shard_file(settings, "lustre", None, job, step, SHARD)
    handle = client.get_workflow_handle(workflow_id(job, step), result_type=LifecycleResult)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + OVERALL_TIMEOUT

    async with (
        running_workers(node_cfg, client, nodes=NODES[:1], shared=False),
        running_workers(settings, client, nodes=[], shared=True),
    ):
        await start_lifecycle(client, LifecycleInput(checkpoint_id=cp, job=job, step=step))
        while not final.exists():
            assert loop.time() < deadline, "the copy to lustre never committed"
            await asyncio.sleep(FAST_POLL)
        await asyncio.to_thread(flip_last_byte, final)
        state_at_flip = await asyncio.to_thread(lustre_state, engine, cp)
        assert state_at_flip == "copying", f"the copy was {state_at_flip} before the flip"
        assert file_crc(final) != good

        # Until the lifecycle ends: whenever the catalog says verified (read first), the bytes
        # on lustre are the right ones, and lustre is never restorable over a wrong byte.
        result_task = asyncio.ensure_future(handle.result())
        wrong_seen = 0
        try:
            while not result_task.done():
                assert loop.time() < deadline, "the lifecycle did not finish"
                state = await asyncio.to_thread(lustre_state, engine, cp)
                markers = await asyncio.to_thread(marker_states, engine, cp)
                crc = await asyncio.to_thread(file_crc, final)
                if crc != good:
                    wrong_seen += 1
                if state == "verified" or markers.get("lustre") == "restorable":
                    assert crc == good, f"lustre {state}/{markers} over a wrong byte"
                await asyncio.wait({result_task}, timeout=0.1)
            result = result_task.result()
        finally:
            result_task.cancel()

    assert wrong_seen > 0, "the damaged copy was never observed"
    assert [(t.tier, t.state) for t in result.tiers] == [
        ("ssd", "restorable"),
        ("lustre", "restorable"),
        ("s3", "restorable"),
    ]
    assert final.read_bytes() == data
    with engine.connect() as conn:
        copied = [
            d
            for (d,) in conn.execute(
                select(Event.detail)
                .where(Event.checkpoint_id == cp, Event.kind == "copied", Event.tier == "lustre")
                .order_by(Event.id)
            )
        ]
        corrupt = conn.scalar(
            select(Event.id).where(Event.checkpoint_id == cp, Event.kind == "corrupt")
        )
    assert len(copied) == 1, copied
    assert [r["path"] for r in copied[0]["recopied"]] == [SHARD], copied
    assert "crc32c" in copied[0]["recopied"][0]["reason"], copied
    # Rewritten whole: the shard's bytes were read twice off the node.
    assert copied[0]["bytes"] == 2 * SHARD_SIZE, copied
    assert corrupt is None, "a rewritten copy is not a corrupt one"
    print(f"damaged copy observed {wrong_seen} times; {copied[0]['recopied']}")
    checked = assert_nothing_lost(settings, engine, {cp: ("ssd", "lustre", "s3")})
    assert checked.verified == checked.restorable == {"ssd": 1, "lustre": 1, "s3": 1}
