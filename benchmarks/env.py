"""What the scenarios run against, started on first use and stopped at the end: a temp dir, a moto
S3 server of our own, the embedded dev stack (`tierpoint dev`, in its own process so that its CPU
is measured apart from ours) and the torch venv that `bootstrap.py` builds."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import httpx

from apps.devstack.facts import StackInfo, read_stack_info
from apps.devstack.services import MotoS3Server
from benchmarks.procs import children_of, cmdline

ROOT = Path(__file__).resolve().parent.parent
STACK_TIMEOUT = 180.0


def bootstrap_module() -> ModuleType:
    """bootstrap.py at the repository root (a script, not a package): the one home of how the
    torch venv is built."""
    spec = importlib.util.spec_from_file_location("tierpoint_bootstrap", ROOT / "bootstrap.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class DevStackProcess:
    """`tierpoint dev` on a fresh data dir and a free port, with two simulated nodes (the
    sustained scenario's checkpoints span both; the others use the first)."""

    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    info: StackInfo | None = None

    def start(self) -> StackInfo:
        self.data_dir.mkdir(parents=True)
        log = open(self.data_dir.parent / "dev-stack.log", "ab")  # noqa: SIM115
        tierpoint = Path(sys.executable).with_name("tierpoint")
        cmd = [str(tierpoint), "dev", "--data-dir", str(self.data_dir), "--port", "0"]
        cmd += ["--nodes", "2", "--no-temporal-ui"]
        self.proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + STACK_TIMEOUT
        while not (self.data_dir / "stack.json").exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"`tierpoint dev` exited with {self.proc.returncode}: see dev-stack.log"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"the dev stack was not ready within {STACK_TIMEOUT:.0f}s")
            time.sleep(0.2)
        self.info = read_stack_info(self.data_dir)
        return self.info

    def pids(self) -> dict[str, tuple[int, bool]]:
        """The workers (the stack's own process), its API (a process of its own), moto, Temporal
        and Postgres (with its backends)."""
        if self.proc is None:
            return {}
        found = {"workers": (self.proc.pid, False)}
        for child in children_of(self.proc.pid):
            line = cmdline(child)
            if "apps.devstack.api_process" in line:
                found["api"] = (child, False)
            elif "moto_server" in line:
                found["moto"] = (child, False)
            elif "temporal" in line:
                found["temporal"] = (child, False)
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid_file = self.data_dir / "postgres" / "postmaster.pid"
            found["postgres"] = (int(pid_file.read_text().split()[0]), True)
        return found

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        # SIGINT: the stack stops its API, workers and services in order.
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@dataclass
class Env:
    work: Path
    quick: bool
    keep: bool = False  # --keep: what the scenarios' own services wrote stays in `work`
    _moto: MotoS3Server | None = None
    _stack: DevStackProcess | None = None
    _torch_python: Path | None = None
    notes: list[str] = field(default_factory=list)

    def moto(self) -> MotoS3Server:
        if self._moto is None:
            server = MotoS3Server()
            server.start(log_file=self.work / "moto.log")
            self._moto = server
        return self._moto

    def stack(self) -> DevStackProcess:
        if self._stack is None:
            stack = DevStackProcess(self.work / "stack")
            self._stack = stack
            stack.start()
        return self._stack

    def torch_python(self) -> Path:
        """The torch venv's python, with s3torchconnector (built or completed on first use)."""
        if self._torch_python is None:
            bootstrap = bootstrap_module()
            bootstrap.sync_torch_venv()
            bootstrap.sync_bench_extras()
            self._torch_python = Path(bootstrap._venv_bin(bootstrap.TORCH_VENV, "python"))
        return self._torch_python

    def close(self) -> None:
        if self._stack is not None:
            self._stack.stop()
        if self._moto is not None:
            self._moto.stop()


def subprocess_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def tierpoint_env(
    work: Path,
    database_url: str,
    temporal_address: str,
    tiers: list[dict[str, str]],
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment of a `tierpoint api` or `worker` process of a scenario: its catalog,
    Temporal and tiers, no config file of the machine's, warnings only."""
    return subprocess_env(
        {
            "TIERPOINT_DATABASE_URL": database_url,
            "TIERPOINT_TEMPORAL_ADDRESS": temporal_address,
            "TIERPOINT_TIERS": json.dumps(tiers),
            "TIERPOINT_CONFIG_FILE": str(work / "none.toml"),
            "TIERPOINT_LOG_LEVEL": "WARNING",
            **(extra or {}),
        }
    )


def wait_for_api(
    http: httpx.Client, proc: subprocess.Popen[bytes], log: Path, timeout: float
) -> None:
    """Until the `tierpoint api` process behind `http` answers /healthz; raises naming its log if
    it exits or does not answer within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if http.get("/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"the API did not start: see {log}")
        time.sleep(0.2)


def json_line(output: str) -> dict[str, object]:
    """The last line of a child's stdout, where it prints its result as JSON."""
    result: dict[str, object] = json.loads(output.strip().splitlines()[-1])
    return result
