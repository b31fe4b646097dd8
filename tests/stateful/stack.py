"""The real stack the stateful test drives, shared by every example of a run: the API as its own
process over HTTP, a worker process for the two nodes that write shards, one for each of the two
nodes that only hold peer copies (holders.py: killed and started again by a rule) and the shared
worker process, on the session's Postgres, Temporal and S3 endpoint; tokens of every scope; and
the tiers read, damaged and emptied directly (files by path, objects with a boto3 client of our
own), never through tierpoint's stores."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import boto3
import httpx
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from tests.stateful.holders import Holders
from tierpoint.config import Settings
from tierpoint.contract.retention import retention_workflow_id
from tierpoint.temporal import request_retention
from tierpoint.tier_config import TierConfig, TierKind

T = TypeVar("T")
PROBLEM = "application/problem+json"
QUIET_POLLS = 3
SCOPES = ("admin", "read", "operate")
# Guards against a hang, not a performance assertion.
SETTLE_TIMEOUT = 300.0


class ServerError(AssertionError):
    """The API answered 5xx, or an error that is not problem+json."""


@dataclass
class Answers:
    """What the API answered over the run, by status class (reported at the end)."""

    by_status: dict[int, int] = field(default_factory=dict)

    def count(self, status: int) -> None:
        self.by_status[status] = self.by_status.get(status, 0) + 1


class Api:
    """The API over HTTP; every answer is checked to be 2xx, or 4xx problem+json."""

    def __init__(self, url: str, answers: Answers, log: Path | None = None) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=120.0)
        self.answers = answers
        # The API process's log: a 5xx's cause is there (its answer says only "retry later").
        self.log = log

    def _cause(self) -> str:
        """The API log's last warning or error lines: what a 5xx answer does not say."""
        if self.log is None:
            return ""
        with contextlib.suppress(OSError):
            lines = self.log.read_text(errors="replace").splitlines()
            said = [ln for ln in lines if "warning" in ln or "error" in ln.lower()]
            return " | API log: " + " / ".join(said[-3:])[-1500:] if said else ""
        return ""

    def call(
        self,
        method: str,
        path: str,
        token: str | None,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if content is not None:
            headers["content-type"] = "application/json"
        for _ in range(TEMPORAL_RETRIES):
            r = self.http.request(
                method, path, json=json, content=content, params=params, headers=headers
            )
            self.answers.count(r.status_code)
            if not _temporal_unavailable(r):
                break
            # Allowed: the API's Temporal calls have a deadline, and on a loaded machine one may
            # pass; the answer says "retry later", as a client would. Temporal runs all along
            # here, so one that never gets through is a failure (any other 5xx at once).
            time.sleep(TEMPORAL_BACKOFF)
        where = f"{method} {path} -> {r.status_code}: {r.text[:600]}"
        if r.status_code >= 500:
            raise ServerError(f"5xx answer: {where}{self._cause()}")
        if r.status_code >= 400:
            ctype = r.headers.get("content-type", "")
            if not ctype.startswith(PROBLEM):
                raise ServerError(f"4xx answer that is not problem+json ({ctype}): {where}")
            code = r.json().get("code")
            if not isinstance(code, str) or not code:
                raise ServerError(f"problem without a stable code: {where}")
        return r


TEMPORAL_RETRIES = 5
TEMPORAL_BACKOFF = 2.0


def _temporal_unavailable(r: httpx.Response) -> bool:
    if r.status_code != 503 or not r.headers.get("content-type", "").startswith(PROBLEM):
        return False
    return bool(r.json().get("code") == "temporal_unavailable")


def code(r: httpx.Response) -> str | None:
    if r.status_code < 400:
        return None
    value = r.json().get("code")
    return str(value) if value is not None else None


class Loop:
    """One asyncio loop in a thread of its own, for the Temporal client (the state machine is
    synchronous)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = SETTLE_TIMEOUT) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def retrying(
        self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = SETTLE_TIMEOUT
    ) -> T:
        """`make()` run until the Temporal dev server knows the namespace: under heavy load its
        namespace registry (refreshed from SQLite) answers "not found" for a while."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.run(make(), timeout)
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND or time.monotonic() > deadline:
                    raise
            time.sleep(1.0)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@dataclass
class Stack:
    settings: Settings
    api: Api
    tokens: dict[str, str]  # admin, read, operate
    # The writers (shards are written on them) first, then the nodes that only hold peer copies.
    nodes: tuple[str, ...]
    holders: Holders
    temporal: Client
    loop: Loop
    answers: Answers
    logs: Path
    s3: Any = None

    def __post_init__(self) -> None:
        tier = self.s3_tier
        self.s3 = boto3.client("s3", endpoint_url=tier.endpoint_url, region_name=tier.region)

    @property
    def s3_tier(self) -> TierConfig:
        return next(t for t in self.settings.tiers if t.kind is TierKind.S3)

    def step_dir(self, tier: str, node: str | None, job: str, step: int) -> Path:
        cfg = self.settings.tier(tier)
        assert cfg.kind is not TierKind.S3
        return cfg.root_for(node if cfg.on_nodes else None) / job / str(step)

    def s3_key(self, job: str, step: int, path: str) -> str:
        return f"{self.s3_tier.prefix}{job}/{step}/{path}"

    def read(self, tier: str, node: str | None, job: str, step: int, path: str) -> bytes | None:
        """A shard's bytes on a tier as they are (None if absent)."""
        if tier == self.s3_tier.name:
            try:
                obj = self.s3.get_object(
                    Bucket=self.s3_tier.bucket, Key=self.s3_key(job, step, path)
                )
            except self.s3.exceptions.NoSuchKey:
                return None
            data: bytes = obj["Body"].read()
            return data
        f = self.step_dir(tier, node, job, step).joinpath(*path.split("/"))
        try:
            return f.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read_location(self, location: str) -> bytes | None:
        """The bytes at a location of a restore plan: a path, or `s3://bucket/key` split at the
        first slash after the bucket (never parsed as a URL: keys may hold `?` and `#`)."""
        if location.startswith("s3://"):
            bucket, _, key = location[len("s3://") :].partition("/")
            try:
                obj = self.s3.get_object(Bucket=bucket, Key=key)
            except self.s3.exceptions.NoSuchKey:
                return None
            data: bytes = obj["Body"].read()
            return data
        try:
            return Path(location).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write(
        self, tier: str, node: str | None, job: str, step: int, path: str, data: bytes
    ) -> None:
        """Put bytes on a tier behind tierpoint's back (a flipped byte, an extra file)."""
        if tier == self.s3_tier.name:
            key = self.s3_key(job, step, path)
            self.s3.put_object(Bucket=self.s3_tier.bucket, Key=key, Body=data)
            return
        f = self.step_dir(tier, node, job, step).joinpath(*path.split("/"))
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)

    def delete(self, tier: str, node: str | None, job: str, step: int, path: str) -> None:
        if tier == self.s3_tier.name:
            key = self.s3_key(job, step, path)
            self.s3.delete_object(Bucket=self.s3_tier.bucket, Key=key)
            return
        f = self.step_dir(tier, node, job, step).joinpath(*path.split("/"))
        f.unlink(missing_ok=True)

    def workflows_running(self, job: str) -> list[str]:
        """Ids of the job's lifecycle, repair, verify and retention workflows still running."""

        async def ids() -> list[str]:
            out: list[str] = []
            for prefix in (f"checkpoint/{job}/", f"retention/{job}"):
                query = f"WorkflowId STARTS_WITH '{prefix}' AND ExecutionStatus = 'Running'"
                out += [wf.id async for wf in self.temporal.list_workflows(query)]
            return out

        return self.loop.retrying(ids)

    def wait_quiet(
        self, job: str, busy: Callable[[], list[str]], timeout: float = SETTLE_TIMEOUT
    ) -> None:
        """Until no workflow of the job runs and `busy` names nothing, seen on several polls in
        a row (a workflow started just now may not be listed yet)."""
        deadline = time.monotonic() + timeout
        quiet = 0
        while True:
            running = self.workflows_running(job) + busy()
            quiet = 0 if running else quiet + 1
            # Done at the last quiet poll: a sleep after it would see nothing more (a settle
            # waits twice, so that sleep cost a second per settle).
            if quiet >= QUIET_POLLS:
                return
            if running and time.monotonic() > deadline:
                raise AssertionError(f"the job never settled within {timeout:g}s: {running}")
            time.sleep(0.5)

    def retention_pass(self, job: str, reason: str) -> None:
        """Ask for one more retention pass over the job and wait for the run to end (following
        continue-as-new)."""

        async def run() -> None:
            await request_retention(self.temporal, job, reason)
            handle = self.temporal.get_workflow_handle(retention_workflow_id(job))
            await handle.result()

        self.loop.retrying(run)

    def terminate_all(self, job: str) -> None:
        async def stop() -> None:
            for prefix in (f"checkpoint/{job}/", f"retention/{job}"):
                query = f"WorkflowId STARTS_WITH '{prefix}' AND ExecutionStatus = 'Running'"
                async for wf in self.temporal.list_workflows(query):
                    # It may have ended meanwhile.
                    with contextlib.suppress(Exception):
                        await self.temporal.get_workflow_handle(wf.id).terminate("example over")

        self.loop.retrying(stop)
