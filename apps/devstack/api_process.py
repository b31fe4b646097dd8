"""The dev stack's API in a process of its own, as production runs it (`tierpoint api` beside
`tierpoint worker`): a registration does not wait for the GIL of the process whose threads run
every node's batch activities, so its latency is the catalog commit's, not the workers' load,
and the two use two cores.

The stack binds the API's socket (a busy port fails before anything starts) and hands it to
`python -m apps.devstack.api_process` with its settings (pickled on the child's stdin: they hold
the stack's secrets, which neither a command line nor the environment of a process should
show). The child writes one line on the ready pipe when it serves (its lifespan ran: catalog and
Temporal checked): its metrics port. It dies with the stack (SIGTERM when the stack dies, even
by SIGKILL, as the stack's servers do) and stops gracefully on the SIGTERM the stack sends it
when it stops."""

from __future__ import annotations

import argparse
import os
import pickle
import select
import socket
import subprocess
import sys
from dataclasses import dataclass, field

from apps.devstack.services import die_with_parent_preexec
from tierpoint.config import Settings

STOP_TIMEOUT = 30.0  # requests in flight finish; the lifespan closes the catalog engine


@dataclass
class ApiProcess:
    settings: Settings
    sock: socket.socket
    log_level: str = "INFO"
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    metrics_port: int | None = field(default=None, init=False)
    _ready_fd: int | None = field(default=None, init=False, repr=False)
    _said: bytes = field(default=b"", init=False, repr=False)
    _served: bool = field(default=False, init=False)

    def start(self) -> None:
        """From the main thread: the child's death signal follows the thread that started it."""
        ready, ready_w = os.pipe()
        fd = self.sock.fileno()
        args = ["--fd", str(fd), "--ready-fd", str(ready_w), "--log-level", self.log_level]
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "apps.devstack.api_process", *args],
                stdin=subprocess.PIPE,
                pass_fds=(fd, ready_w),
                # Out of the terminal's process group, as the stack's servers: Ctrl-C reaches
                # the stack alone, which stops the API first, then the workers.
                start_new_session=True,
                preexec_fn=die_with_parent_preexec(),  # resolved before the fork
            )
        finally:
            os.close(ready_w)
        self._ready_fd = ready
        assert self.proc.stdin is not None
        with self.proc.stdin:
            self.proc.stdin.write(pickle.dumps(self.settings))

    @property
    def exitcode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def serving(self) -> bool:
        """Whether the API serves; False while it starts, or once it exited without serving
        (`exitcode` says so). Never blocks."""
        if self._served or self._ready_fd is None:
            return self._served
        while select.select([self._ready_fd], [], [], 0)[0]:
            chunk = os.read(self._ready_fd, 64)
            if not chunk:
                return False
            self._said += chunk
            if self._said.endswith(b"\n"):
                port = self._said.strip()
                self.metrics_port = int(port) if port.isdigit() else None
                self._served = True
                return True
        return False

    def wait(self) -> int | None:
        """Block until the API process ends (run in a thread); its exit code."""
        return None if self.proc is None else self.proc.wait()

    def stop(self) -> None:
        """SIGTERM (uvicorn finishes the requests in flight and runs the lifespan's shutdown),
        then SIGKILL if it does not end."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._ready_fd is not None:
            os.close(self._ready_fd)
            self._ready_fd = None


def _serve(settings: Settings, sock: socket.socket, ready: int, log_level: str) -> None:
    """The child: the API on the inherited socket until SIGTERM."""
    import uvicorn

    from api.app import create_app
    from tierpoint import logs
    from tierpoint.long_lived import freeze_long_lived

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                port = getattr(app.state, "metrics_port", None)
                os.write(ready, f"{'' if port is None else port}\n".encode())
            os.close(ready)

    logs.configure(log_level)
    app = create_app(settings)
    # uvicorn's lines through our logs, as `tierpoint api` has them (apps/cli/serve.py).
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on", log_config=None, access_log=False
    )
    server = Server(config)
    freeze_long_lived()
    server.run(sockets=[sock])


def main() -> None:
    p = argparse.ArgumentParser(description="the dev stack's API (started by `tierpoint dev`)")
    p.add_argument("--fd", type=int, required=True, help="the listening socket, inherited")
    p.add_argument("--ready-fd", type=int, required=True, help="written to once serving")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args()
    # Written by the stack that started this process, never by anyone else.
    settings = pickle.loads(sys.stdin.buffer.read())
    assert isinstance(settings, Settings)
    sock = socket.socket(fileno=args.fd)
    _serve(settings, sock, args.ready_fd, args.log_level)


if __name__ == "__main__":
    main()
