"""The API as a separate OS process (`tierpoint api`, uvicorn), so that a fault test can SIGKILL
it with a request in flight, with the test's Settings passed as TIERPOINT_* variables."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.worker_process import REPO, settings_env
from tierpoint.config import Settings

# Guards against a hang, not a performance assertion.
START_TIMEOUT = 120.0


class ApiProcess:
    def __init__(self, settings: Settings, port: int, log: Path) -> None:
        self.log = log
        self.url = f"http://127.0.0.1:{port}"
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "apps.cli.main",
                    "api",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                ],
                cwd=REPO,
                env=settings_env(settings),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_ready(self) -> None:
        """Until /healthz answers (blocking: call it in a thread)."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert self.alive(), f"the API exited:\n{self.output()}"
            assert time.monotonic() < deadline, f"the API never answered:\n{self.output()}"
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url + "/healthz", timeout=2) as resp,
            ):
                if resp.status == 200:
                    return
            time.sleep(0.1)

    def kill(self) -> int:
        """SIGKILL: requests in flight get no answer; returns the exit status."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=60)

    def output(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-4000:]
        return ""


@contextlib.contextmanager
def api_process(settings: Settings, port: int, log: Path) -> Iterator[ApiProcess]:
    api = ApiProcess(settings, port, log)
    try:
        yield api
    finally:
        api.kill()
