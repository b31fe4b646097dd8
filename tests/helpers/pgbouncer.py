"""A real PgBouncer (Debian's) for the tests, configured by the file the manifests ship
(deploy/kubernetes/pgbouncer/pgbouncer.ini) with only its addresses and paths replaced: the
database entry points at the test's Postgres, it listens on a free 127.0.0.1 port, and runs as
an unprivileged user (PgBouncer refuses to run as root). Stopped by pid."""

from __future__ import annotations

import configparser
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from apps.devstack.services import free_port
from tests.helpers.debian_tools import require
from tests.helpers.worker_process import REPO

INI = REPO / "deploy" / "kubernetes" / "pgbouncer" / "pgbouncer.ini"
START_TIMEOUT = 60.0  # a hang guard
RUN_AS = "nobody"


def _server(server_url: str) -> tuple[str, int, str]:
    """Host (a name, an address or a unix socket directory), port and database of a URL."""
    parts = urlsplit(server_url.replace("postgresql+psycopg://", "postgresql://"))
    query = parse_qs(parts.query)
    host = query.get("host", [parts.hostname or "127.0.0.1"])[0]
    port = int(query.get("port", [parts.port or 5432])[0])
    return host, port, parts.path.lstrip("/")


def _settings(database: str, server_url: str, port: int, auth_file: Path) -> str:
    """The shipped pgbouncer.ini with the test's database, port and auth file."""
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.read_string(INI.read_text())
    host, server_port, dbname = _server(server_url)
    parser["databases"] = {database: f"host={host} port={server_port} dbname={dbname}"}
    listen = parser["pgbouncer"]
    listen["listen_addr"] = "127.0.0.1"
    listen["listen_port"] = str(port)
    listen["auth_file"] = str(auth_file)
    listen["server_tls_sslmode"] = "disable"  # the embedded Postgres has no certificate
    out: list[str] = []
    for section in parser.sections():
        out.append(f"[{section}]")
        out += [f"{k} = {v}" for k, v in parser[section].items()]
    return "\n".join(out) + "\n"


@dataclass
class PgBouncer:
    root: Path
    port: int = 0
    _proc: subprocess.Popen[bytes] | None = None

    def start(self, database: str, server_url: str, users: dict[str, str]) -> None:
        """Serve `database` (the database of `server_url`) to `users` (name -> password)."""
        binary = require("pgbouncer")["pgbouncer"]
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        auth = self.root / "userlist.txt"
        auth.write_text("".join(f'"{u}" "{p}"\n' for u, p in users.items()))
        self.port = free_port()
        ini = self.root / "pgbouncer.ini"
        ini.write_text(_settings(database, server_url, self.port, auth))
        args = [binary, str(ini)]
        if os.geteuid() == 0:
            # PgBouncer refuses root. It runs as the user that owns the server's socket directory
            # (the embedded Postgres's own user), else as nobody for a server on TCP.
            host = _server(server_url)[0]
            owner = os.stat(host).st_uid if host.startswith("/") else pwd.getpwnam(RUN_AS).pw_uid
            user = pwd.getpwuid(owner)
            args[1:1] = ["-u", user.pw_name]
            for path in (auth, ini):
                shutil.chown(path, user.pw_uid, user.pw_gid)
        log = (self.root / "pgbouncer.log").open("ab")
        self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited ({self._proc.returncode}):\n{self.output()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def output(self) -> str:
        return (self.root / "pgbouncer.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
