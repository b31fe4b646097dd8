"""The product end to end, as a user runs it: `tierpoint dev`, `tierpoint demo`,
`tierpoint restore`, Ctrl-C, and `tierpoint dev` again on the same data dir.

Every piece is real: the embedded Postgres, Temporal dev server and moto S3 that `tierpoint dev`
starts, its workers and API, and the CLI as subprocesses.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import crc32c
import httpx
import pytest

from apps.devstack.facts import StackInfo, StackNotRunning, read_stack_info

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = [pytest.mark.slow, pytest.mark.full_stack]

START_TIMEOUT = 240.0
STOP_TIMEOUT = 120.0
CHECKPOINTS = 3
SHARDS = 4
STEPS = [100 * (k + 1) for k in range(CHECKPOINTS)]


def _env() -> dict[str, str]:
    # The CLI must find everything through --data-dir, not through the test session's settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIERPOINT_", "AWS_"))}
    env["COLUMNS"] = "160"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "apps.cli.main", *args]


def _tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no output)"


def _descendants(pid: int) -> set[int]:
    """Every live descendant of pid, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass
class DevProcess:
    proc: subprocess.Popen[bytes]
    data_dir: Path
    log: Path
    info: StackInfo

    def api(self) -> httpx.Client:
        """A client with the stack's admin token, as `source stack.env` gives it."""
        assert self.info.token is not None
        headers = {"Authorization": f"Bearer {self.info.token}"}
        return httpx.Client(base_url=self.info.api_url, headers=headers, timeout=30)

    def owned_pids(self) -> set[int]:
        """The dev process, its descendants, and the postmaster (pg_ctl daemonizes it)."""
        pids = {self.proc.pid} | _descendants(self.proc.pid)
        pm = self.data_dir / "postgres" / "postmaster.pid"
        if pm.exists():
            postmaster = int(pm.read_text().splitlines()[0])
            pids |= {postmaster} | _descendants(postmaster)
        return pids

    def interrupt(self, sig: signal.Signals = signal.SIGINT) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"tierpoint dev did not stop on {sig.name}:\n{_tail(self.log)}")


def _fresh_facts(data_dir: Path, stale: StackInfo | None) -> bool:
    """stack.json exists and is not the one a killed stack left (`stale`)."""
    try:
        return read_stack_info(data_dir) != stale
    except (StackNotRunning, ValueError, KeyError):  # absent, or being replaced
        return False


def start_dev(
    data_dir: Path,
    log: Path,
    stale: StackInfo | None = None,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> DevProcess:
    """`env`: variables added to the clean environment (the user's settings, e.g. the tiers);
    `args`: more arguments of `tierpoint dev` (`--tiers FILE`)."""
    stack_json = data_dir / "stack.json"
    out = open(log, "ab")  # noqa: SIM115  # owned by the process for its lifetime
    proc = subprocess.Popen(
        _cli("dev", "--data-dir", str(data_dir), "--port", "0", "--nodes", "2", *args),
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=_env() | (env or {}),
    )
    out.close()
    deadline = time.monotonic() + START_TIMEOUT
    while not (stack_json.exists() and _fresh_facts(data_dir, stale)):
        if proc.poll() is not None:
            pytest.fail(f"tierpoint dev exited with {proc.returncode}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            proc.send_signal(signal.SIGINT)
            proc.wait(STOP_TIMEOUT)
            pytest.fail(f"no stack.json after {START_TIMEOUT}s:\n{_tail(log)}")
        time.sleep(0.5)
    return DevProcess(proc, data_dir, log, read_stack_info(data_dir))


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    # Outside pytest's basetemp: the embedded Postgres runs as its own system user (we are root in
    # CI), and a concurrent pytest session re-chmods basetemp to 0700, locking that user out.
    root = Path(tempfile.mkdtemp(prefix="tierpoint-e2e-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def dev(data_dir: Path) -> Iterator[DevProcess]:
    running = start_dev(data_dir / "dev", data_dir / "dev-1.log")
    yield running
    if running.proc.poll() is None:
        running.interrupt()


def run_demo(dev: DevProcess, job: str, checkpoints: int = CHECKPOINTS) -> None:
    """`tierpoint demo` against `dev`, to its end (every checkpoint restorable on s3)."""
    result = subprocess.run(
        _cli(
            "demo",
            "--data-dir",
            str(dev.data_dir),
            "--job",
            job,
            "--checkpoints",
            str(checkpoints),
            "--shards",
            str(SHARDS),
            "--shard-size",
            "1MiB",
            "--interval",
            "0.5",
        ),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert result.returncode == 0, (
        f"demo failed ({result.returncode}):\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
        f"\n--- tierpoint dev ---\n{_tail(dev.log)}"
    )
    assert f"step {100 * checkpoints}" in result.stdout


@pytest.fixture(scope="module")
def demo_job(dev: DevProcess) -> str:
    job = f"e2e-{uuid.uuid4().hex[:8]}"
    run_demo(dev, job)
    return job


def _checkpoint(dev: DevProcess, job: str, step: int) -> dict[str, Any]:
    with dev.api() as api:
        resp = api.get(f"/v1/jobs/{job}/checkpoints/{step}")
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def test_stack_json_describes_the_running_stack(dev: DevProcess) -> None:
    info = dev.info
    assert set(info.nodes) == {"node-1", "node-2"}
    for node, root in info.nodes.items():
        assert Path(root) == dev.data_dir.resolve() / "nodes" / node / "ssd"
        assert Path(root).is_dir()
    assert info.shared_root is not None
    assert Path(info.shared_root) == dev.data_dir.resolve() / "lustre"
    assert [(t["name"], t["kind"]) for t in info.tiers] == [
        ("ssd", "local"),
        ("lustre", "shared"),
        ("s3", "s3"),
    ]
    assert info.api_url.startswith("http://127.0.0.1:")
    with dev.api() as api:
        assert api.get("/healthz").status_code == 200
        tiers = api.get("/v1/tiers").json()
    assert [(t["name"], t["kind"]) for t in tiers] == [
        ("ssd", "local"),
        ("lustre", "shared"),
        ("s3", "s3"),
    ]
    env = (dev.data_dir / "stack.env").read_text()
    assert f"export TIERPOINT_API_URL={info.api_url}" in env
    # The stack's admin token: required by the API, in both files, which only their owner reads.
    assert info.token is not None and info.token.startswith("tp_")
    assert f"export TIERPOINT_TOKEN={info.token}" in env
    for name in ("stack.json", "stack.env"):
        assert (dev.data_dir / name).stat().st_mode & 0o077 == 0, name
    refused = httpx.get(f"{info.api_url}/v1/tiers", timeout=30)
    assert refused.status_code == 401 and refused.json()["code"] == "missing_token"


def test_demo_checkpoints_are_restorable_on_s3_with_the_original_bytes(
    dev: DevProcess, demo_job: str
) -> None:
    with dev.api() as api:
        resp = api.get(f"/v1/jobs/{demo_job}/checkpoints/latest", params={"tier": "s3"})
    assert resp.status_code == 200, resp.text
    latest = resp.json()
    assert latest["step"] == STEPS[-1]
    assert {e["tier"] for e in latest["plan"]} == {"s3"}
    assert len(latest["plan"]) == SHARDS

    s3 = boto3.client(
        "s3",
        endpoint_url=dev.info.s3.endpoint_url,
        region_name=dev.info.s3.region,
        aws_access_key_id=dev.info.s3.access_key_id,
        aws_secret_access_key=dev.info.s3.secret_access_key,
    )
    compared = 0
    for step in STEPS:
        cp = _checkpoint(dev, demo_job, step)
        states = {t["tier"]: t["state"] for t in cp["tiers"]}
        # The most durable tier keeps everything; faster tiers at least the newest checkpoint.
        assert states["s3"] == "restorable", states
        if step == STEPS[-1]:
            assert states["ssd"] == states["lustre"] == "restorable", states
        assert len(cp["shards"]) == SHARDS
        for shard in cp["shards"]:
            replicas = {r["tier"]: r for r in shard["replicas"]}
            key = f"{demo_job}/{step}/{shard['path']}"
            assert replicas["s3"]["state"] == "verified"
            assert replicas["s3"]["location"] == f"s3://{dev.info.s3.bucket}/{key}"
            in_s3 = s3.get_object(Bucket=dev.info.s3.bucket, Key=key)["Body"].read()
            assert len(in_s3) == shard["size"]
            assert f"{crc32c.crc32c(in_s3):08x}" == shard["crc32c"]

            assert dev.info.shared_root is not None
            lustre = Path(dev.info.shared_root) / demo_job / str(step) / shard["path"]
            if states["lustre"] == "restorable":
                assert replicas["lustre"]["state"] == "verified"
                assert replicas["lustre"]["location"] == str(lustre)
                assert lustre.read_bytes() == in_s3
            # Retention may already have expired older local copies; the ones left are the
            # bytes the job wrote, and every copy must equal them.
            original = Path(dev.info.nodes[shard["node"]]) / demo_job / str(step) / shard["path"]
            if states["ssd"] == "restorable":
                assert original.read_bytes() == in_s3
                compared += 1
    assert compared >= SHARDS


def test_demo_leaves_the_oldest_local_copies_expired(dev: DevProcess, demo_job: str) -> None:
    """The README's promise: the default policy keeps the newest 2 checkpoints on the local tier,
    so after the third demo checkpoint the oldest local copies are `expired` and their files are
    gone, while the shared tier and S3 still hold them."""
    oldest, *newer = STEPS
    # A guard against a hang, not a timing assertion: retention runs after the demo has seen
    # every tier settle.
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        cp = _checkpoint(dev, demo_job, oldest)
        states = {t["tier"]: t["state"] for t in cp["tiers"]}
        if states["ssd"] == "expired":
            break
        if time.monotonic() > deadline:
            pytest.fail(f"step {oldest} on ssd is still {states['ssd']}:\n{_tail(dev.log)}")
        time.sleep(0.5)
    assert states["lustre"] == states["s3"] == "restorable", states
    for shard in cp["shards"]:
        replicas = {r["tier"]: r["state"] for r in shard["replicas"]}
        assert replicas["ssd"] == "expired", shard
        original = Path(dev.info.nodes[shard["node"]]) / demo_job / str(oldest) / shard["path"]
        assert not original.exists(), original
    for step in newer:
        states = {t["tier"]: t["state"] for t in _checkpoint(dev, demo_job, step)["tiers"]}
        assert states == {"ssd": "restorable", "lustre": "restorable", "s3": "restorable"}, step


def test_restore_gives_the_original_bytes(dev: DevProcess, demo_job: str, tmp_path: Path) -> None:
    dest = tmp_path / "restored"
    result = subprocess.run(
        _cli("restore", demo_job, str(dest), "--data-dir", str(dev.data_dir), "--tier", "s3"),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    cp = _checkpoint(dev, demo_job, STEPS[-1])
    restored = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert restored == sorted(s["path"] for s in cp["shards"])
    for shard in cp["shards"]:
        original = Path(dev.info.nodes[shard["node"]]) / demo_job / str(STEPS[-1]) / shard["path"]
        assert (dest / shard["path"]).read_bytes() == original.read_bytes()


def test_checkpoints_cli_lists_the_demo_job(dev: DevProcess, demo_job: str) -> None:
    result = subprocess.run(
        _cli("checkpoints", "list", demo_job, "--data-dir", str(dev.data_dir)),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for step in STEPS:
        assert str(step) in result.stdout
    missing = subprocess.run(
        _cli("checkpoints", "show", demo_job, "999999", "--data-dir", str(dev.data_dir)),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert missing.returncode == 1
    assert "checkpoint_not_found" in missing.stderr


def _stack_env(dev: DevProcess) -> dict[str, str]:
    """The environment a shell gets from `source DIR/stack.env`."""
    out = subprocess.run(
        ["bash", "-c", 'source "$1" && env -0', "_", str(dev.data_dir / "stack.env")],
        capture_output=True,
        check=True,
        env=_env(),
    ).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def test_status_and_migrate_check_against_the_stack(dev: DevProcess) -> None:
    status = subprocess.run(
        _cli("status", "--data-dir", str(dev.data_dir)),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert status.returncode == 0, f"{status.stdout}\n{status.stderr}"
    assert "/readyz" in status.stdout
    # A shell that sourced stack.env reaches the stack's catalog with the production commands.
    check = subprocess.run(
        _cli("migrate", "--check"),
        capture_output=True,
        text=True,
        env=_stack_env(dev),
        timeout=120,
        cwd=dev.data_dir,
    )
    assert check.returncode == 0, f"{check.stdout}\n{check.stderr}"
    assert "at head" in check.stdout


def test_the_stack_logs_hold_neither_its_token_nor_its_s3_secret(
    dev: DevProcess, demo_job: str
) -> None:
    logs = [dev.log, *sorted((dev.data_dir / "logs").iterdir())]
    text = "\n".join(p.read_text(errors="replace") for p in logs if p.is_file())
    assert text, logs
    assert dev.info.token is not None
    for secret in (dev.info.token, dev.info.token[3:], dev.info.s3.secret_access_key):
        assert secret not in text


def test_sigint_stops_everything_and_a_restart_keeps_the_catalog_until_sigterm(
    data_dir: Path,
) -> None:
    # A stack of its own: stopping the module's stack would take it from the tests after this one.
    dev = start_dev(data_dir / "own", data_dir / "own-1.log")
    demo_job = f"e2e-{uuid.uuid4().hex[:8]}"
    try:
        run_demo(dev, demo_job, checkpoints=1)
    except BaseException:
        dev.interrupt()
        raise
    pids = dev.owned_pids()
    # Postgres, Temporal and moto at least, besides the dev process itself.
    assert len(pids) >= 4, pids
    assert dev.interrupt() == 0, _tail(dev.log)
    assert not (dev.data_dir / "stack.json").exists()
    left = {pid for pid in pids if _alive(pid)}
    assert left == set(), f"processes left after SIGINT: {left}"

    again = start_dev(dev.data_dir, data_dir / "own-2.log")
    try:
        with again.api() as api:
            resp = api.get(f"/v1/jobs/{demo_job}/checkpoints")
        assert resp.status_code == 200, resp.text
        # Each start makes a new admin token; the previous run's no longer works.
        assert again.info.token != dev.info.token
        with dev.api() as old:
            stale = old.get(f"{again.info.api_url}/v1/jobs/{demo_job}/checkpoints")
        assert stale.status_code == 401, stale.text
        steps = sorted(item["step"] for item in resp.json()["items"])
        assert steps == [100]
        cp = _checkpoint(again, demo_job, 100)
        states = {t["tier"]: t["state"] for t in cp["tiers"]}
        assert states["lustre"] == "restorable"
    finally:
        pids = again.owned_pids()
        # A service manager stops it with SIGTERM: the same orderly shutdown.
        assert again.interrupt(signal.SIGTERM) == 0, _tail(again.log)
    assert {pid for pid in pids if _alive(pid)} == set()
    assert not (again.data_dir / "stack.json").exists()
