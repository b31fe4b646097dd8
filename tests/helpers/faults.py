"""Helpers of the fault tests: waiting for a condition, for an activity's retry or heartbeat, for
workers to report in, reading markers and replicas while a service is away, and reading the
request log of an S3 endpoint of the test's own."""

from __future__ import annotations

import asyncio
import os
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from prometheus_client import REGISTRY
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import sessionmaker
from temporalio.client import Client, WorkflowHandle

from apps.devstack.services import MotoS3Server
from tests.helpers.lifecycle import ShardSpec, crc_hex, new_job, seed_checkpoint
from tests.helpers.pending import pending_copy
from tests.helpers.services import NODES
from tierpoint.catalog.models import Replica, TierCopy
from tierpoint.config import Settings
from tierpoint.contract.lifecycle import COPY_BATCH

# Guards against a hang, not a performance assertion.
OVERALL_TIMEOUT = 180.0
POLL = 0.2


def make_tier_dirs(root: Path) -> None:
    for node in NODES:
        (root / "nodes" / node / "ssd").mkdir(parents=True, exist_ok=True)
    (root / "lustre").mkdir(exist_ok=True)


def s3_client_for(moto: MotoS3Server) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=moto.endpoint_url,
        region_name=moto.region,
        aws_access_key_id=moto.access_key_id,
        aws_secret_access_key=moto.secret_access_key,
    )


async def eventually(
    what: str, check: Callable[[], Awaitable[bool]], limit: float = OVERALL_TIMEOUT
) -> None:
    """Poll `check` until it holds; fail naming `what` if it never does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"never happened within {limit:g}s: {what}")
        await asyncio.sleep(POLL)


def marker_states(engine: Engine, checkpoint_id: int) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(TierCopy.tier, TierCopy.state).where(TierCopy.checkpoint_id == checkpoint_id)
        )
        return {t: st for t, st in rows}


async def retried_activity(handle: WorkflowHandle[Any, Any], activity_type: str) -> str | None:
    """The last failure of a pending activity of this type that is on its second attempt or
    later (so one attempt has failed), else None."""
    desc = await handle.describe()
    for act in desc.raw_description.pending_activities:
        if act.activity_type.name == activity_type and act.attempt >= 2:
            return act.last_failure.message or "failed"
    return None


async def wait_for_retry(handle: WorkflowHandle[Any, Any], activity_type: str) -> str:
    """Wait until an activity of this type has failed once and waits for (or runs) a retry;
    returns its last failure."""
    seen: list[str] = []

    async def check() -> bool:
        msg = await retried_activity(handle, activity_type)
        if msg is not None:
            seen.append(msg)
        return msg is not None

    await eventually(f"an activity {activity_type} failed and is retried", check)
    return seen[-1]


def activity_errors(activity_type: str) -> float:
    """Attempts of a lifecycle activity of this type that failed in this process's workers, from
    their metrics: local activities (plan, promote) retry inside the worker, out of Temporal's
    pending-activity view."""
    return (
        REGISTRY.get_sample_value(
            "tierpoint_worker_activity_seconds_count",
            {"activity": activity_type, "outcome": "error"},
        )
        or 0.0
    )


def db_now(engine: Engine) -> Any:
    with engine.connect() as conn:
        return conn.scalar(text("SELECT now()"))


async def workers_reported_in(engine: Engine, nodes: tuple[str, ...], since: Any) -> None:
    """Node workers report in after their schema check: once every node row is fresh, the
    workers need the catalog no more to start."""

    def fresh() -> bool:
        with engine.connect() as conn:
            n = conn.scalar(
                text("SELECT count(*) FROM node WHERE id = ANY(:ids) AND last_seen_at > :since"),
                {"ids": list(nodes), "since": since},
            )
        return int(n or 0) == len(nodes)

    async def check() -> bool:
        return await asyncio.to_thread(fresh)

    await eventually("every node worker reported in", check)


def s3_replica(engine: Engine, checkpoint_id: int) -> tuple[str | None, int]:
    with engine.connect() as conn:
        row = conn.execute(
            select(Replica.state, Replica.bytes_done).where(
                Replica.checkpoint_id == checkpoint_id, Replica.tier == "s3"
            )
        ).one_or_none()
    return (str(row[0]), int(row[1] or 0)) if row else (None, 0)


async def upload_heartbeat(
    client: Client, handle: WorkflowHandle[Any, Any]
) -> tuple[int, dict[str, Any]]:
    """(attempt, last heartbeat details) of the pending copy batch to s3 as the Temporal server
    holds them: the details carry the upload id once an attempt has one; (0, {}) when none."""
    pending = await pending_copy(client, handle, "s3")
    return pending.attempt, pending.details


async def failed_attempts(handle: WorkflowHandle[Any, Any], n: int) -> list[str]:
    """Wait until n attempts of the pending copy have failed; their last failure messages."""
    seen: dict[int, str] = {}

    async def check() -> bool:
        desc = await handle.describe()
        for pa in desc.raw_description.pending_activities:
            if pa.activity_type.name == COPY_BATCH and pa.attempt >= 2:
                # The server keeps a long retryable failure (a stack trace) as the cause of a
                # "Failure exceeds size limit." of its own.
                last = pa.last_failure
                seen[pa.attempt - 1] = (last.cause.message or last.message) or "failed"
                return pa.attempt > n
        return False

    await eventually(f"{n} attempts of the copy batch failed", check)
    return [seen[k] for k in sorted(seen)]


@dataclass(frozen=True)
class SlowUpload:
    """A one-shard checkpoint on the first node whose s3 stage is a slow multipart upload to a
    test-owned endpoint: `cfg` for the shared worker (the workflows), `node_cfg` (the local tier
    read at `read_limit`) for the node's worker, which uploads: the copies fan out from the
    node's local copy (its copy to lustre shares the limit)."""

    cfg: Settings
    node_cfg: Settings
    job: str
    step: int
    checkpoint_id: int
    key: str
    data: bytes


def slow_upload(
    settings: Settings,
    engine: Engine,
    *,
    endpoint_url: str,
    bucket: str,
    step: int,
    path: str,
    size: int,
    part_size: int,
    read_limit: int,
    heartbeat_timeout: float,
) -> SlowUpload:
    s3_tier = settings.tier("s3").model_copy(
        update={
            "bucket": bucket,
            "endpoint_url": endpoint_url,
            "multipart_part_size": part_size,
            "multipart_concurrency": 1,
        }
    )
    cfg = settings.model_copy(
        update={
            "tiers": [t if t.name != "s3" else s3_tier for t in settings.tiers],
            "batch_heartbeat_timeout_seconds": heartbeat_timeout,
        }
    )
    slow_local = cfg.tier("ssd").model_copy(update={"read_bandwidth_limit": read_limit})
    node_cfg = cfg.model_copy(
        update={"tiers": [t if t.name != "ssd" else slow_local for t in cfg.tiers]}
    )
    data = os.urandom(size)
    seeded = seed_checkpoint(
        cfg, sessionmaker(engine), new_job(), step, [ShardSpec(NODES[0], path, data, crc_hex(data))]
    )
    key = f"{s3_tier.prefix}{seeded.job}/{seeded.step}/{path}"
    return SlowUpload(cfg, node_cfg, seeded.job, seeded.step, seeded.checkpoint_id, key, data)


async def upload_under_way(
    client: Client,
    handle: WorkflowHandle[Any, Any],
    engine: Engine,
    checkpoint_id: int,
    *,
    deadline: float,
    too_late: str,
) -> tuple[str, int]:
    """Wait until the s3 upload is under way: bytes done in the catalog, and the Temporal server
    holding the upload id and an offset a retry would resume from. Returns (upload id, offset);
    fails with `too_late` if the copy finished first."""
    loop = asyncio.get_running_loop()
    while True:
        assert loop.time() < deadline, "the upload to s3 never got under way"
        state, done = await asyncio.to_thread(s3_replica, engine, checkpoint_id)
        assert state != "verified", too_late
        _, beat = await upload_heartbeat(client, handle)
        if state == "copying" and done > 0 and beat.get("upload_id") and beat["offset"]:
            return str(beat["upload_id"]), int(beat["offset"])
        await asyncio.sleep(POLL)


@dataclass(frozen=True)
class S3Request:
    """One request as moto's server logged it (werkzeug logs a request once it is answered)."""

    method: str
    path: str
    query: dict[str, str]
    status: int


_REQUEST_LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<target>\S+) HTTP/[0-9.]+" (?P<status>\d{3})')


def s3_requests(log: Path) -> list[S3Request]:
    """The requests an S3 endpoint of ours (MotoS3Server with a log file) answered, in order."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = _REQUEST_LINE.search(line)
        if m is None:
            continue
        parts = urllib.parse.urlsplit(m["target"])
        query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
        out.append(
            S3Request(m["method"], urllib.parse.unquote(parts.path), query, int(m["status"]))
        )
    return out
