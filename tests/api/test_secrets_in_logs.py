"""Secrets stay out of logs, events and output: a real flow through real processes (`tierpoint
token create`, `tierpoint api` and `tierpoint worker` at DEBUG with uvicorn's access log, the
client registering a checkpoint that is copied to S3, `tierpoint restore` from S3), after which
every captured line and every event is searched for the API token and the S3 secret key."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text
from tierpoint_client import Client, RetryPolicy

from apps.devstack.services import free_port, stop_popen
from tests.helpers.client import read_tree, write_shards
from tests.helpers.services import NODES
from tests.helpers.worker_process import REPO, settings_env
from tierpoint.config import Settings

pytestmark = pytest.mark.slow

START_TIMEOUT = 120.0


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "apps.cli.main", *args]


def _env(settings: Settings, s3_key: str, s3_secret: str) -> dict[str, str]:
    env = settings_env(settings)
    env.update(
        TIERPOINT_LOG_LEVEL="DEBUG",
        AWS_ACCESS_KEY_ID=s3_key,
        AWS_SECRET_ACCESS_KEY=s3_secret,
        PYTHONUNBUFFERED="1",
        COLUMNS="200",
    )
    return env


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


@pytest.fixture
def processes(settings: Settings, tmp_path: Path) -> Iterator[tuple[str, dict[str, str], Path]]:
    """`tierpoint api` and `tierpoint worker` (shared + both nodes) with S3 credentials of their
    own (moto takes any), their output in tmp_path/logs."""
    logs = tmp_path / "logs"
    logs.mkdir()
    env = _env(settings, f"AKIA{uuid.uuid4().hex[:16].upper()}", f"s3secret-{uuid.uuid4().hex}")
    port = free_port()
    node_args = [a for n in NODES for a in ("--node", n)]
    # uvicorn's access log is on at DEBUG: it must not carry the token either.
    api = _spawn(_cli("api", "--port", str(port)), env, logs / "api.log")
    worker = _spawn(_cli("worker", *node_args), env, logs / "worker.log")
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert api.poll() is None, (logs / "api.log").read_text()
            assert worker.poll() is None, (logs / "worker.log").read_text()
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the API did not start"
            time.sleep(0.2)
        yield url, env, logs
    finally:
        stop_popen(api, 30)
        stop_popen(worker, 30)


def _nodes_known(catalog: Engine) -> bool:
    with catalog.connect() as conn:
        n = conn.execute(text("SELECT count(*) FROM node WHERE id = ANY(:n)"), {"n": list(NODES)})
        return int(n.scalar_one()) == len(NODES)


def test_no_token_or_s3_secret_in_any_log_or_event(
    settings: Settings,
    catalog: Engine,
    processes: tuple[str, dict[str, str], Path],
    tmp_path: Path,
) -> None:
    url, env, logs = processes
    s3_secret = env["AWS_SECRET_ACCESS_KEY"]
    made = subprocess.run(
        _cli("token", "create", f"trainer-{uuid.uuid4().hex[:6]}", "--scope", "train:leak-"),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert made.stdout == token + "\n" and token.startswith("tp_")
    assert token not in made.stderr
    (logs / "token-create.err").write_text(made.stderr)

    deadline = time.monotonic() + START_TIMEOUT
    while not _nodes_known(catalog):
        assert time.monotonic() < deadline, "the node workers did not report in"
        time.sleep(0.2)

    job, step, node = f"leak-{uuid.uuid4().hex[:8]}", 10, NODES[0]
    directory = settings.tier("ssd").root_for(node) / job / str(step)
    written = write_shards(directory, {"model/0.bin": 300_000, "model/1.bin": 5})
    client = Client(url, token=token, retry=RetryPolicy(attempts=4, initial_backoff=0.1))
    client.register(job, step, directory, node)
    client.wait_restorable(job, step, "s3", timeout=300)
    # A refused request is logged too: with a token that is wrong, and one that is too small.
    wrong = token[:-1] + ("y" if token.endswith("x") else "x")
    for secret, status in ((token, 403), (wrong, 401)):
        r = httpx.get(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {secret}"})
        assert r.status_code == status, r.text

    dest = tmp_path / "restored"
    restored = subprocess.run(
        _cli("restore", job, str(dest), "--tier", "s3", "--api-url", url),
        env={**env, "TIERPOINT_TOKEN": token},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert read_tree(dest) == written
    (logs / "restore.out").write_text(restored.stdout + restored.stderr)

    lines = [
        (p.name, line)
        for p in sorted(logs.iterdir())
        for line in p.read_text(errors="replace").splitlines()
    ]
    # The flow was logged (DEBUG, access log on): the search below searched something.
    assert any("/v1/jobs" in line for name, line in lines if name == "api.log"), lines[-20:]
    assert len(lines) > 20
    with catalog.connect() as conn:
        rows = conn.execute(text("SELECT e::text FROM event e")).scalars().all()
    assert len(rows) > 3
    for secret in (token, token[3:], s3_secret):
        hits = [x for x in lines if secret in x[1]] + [("event", r) for r in rows if secret in r]
        assert hits == []
