"""Workers as separate OS processes (`tierpoint worker --node N --no-shared`, or the shared worker
`tierpoint worker`), so that a fault test can SIGKILL one mid-copy, with the test's Settings
passed as TIERPOINT_* variables."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from pydantic import SecretStr

from tierpoint.config import Settings

REPO = Path(__file__).resolve().parents[2]


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment of a process whose Settings() equal `settings`: every field as a TIERPOINT_*
    variable (lists such as the tiers as JSON), nothing inherited from ours or a TOML file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERPOINT_")}
    env["TIERPOINT_CONFIG_FILE"] = os.devnull
    for name, value in settings.model_dump(mode="json").items():
        if value is None:
            continue
        secret = getattr(settings, name)
        if isinstance(secret, SecretStr):
            # A JSON dump masks a secret ("**********"): the process needs the real one.
            value = secret.get_secret_value()
        env[f"TIERPOINT_{name.upper()}"] = value if isinstance(value, str) else json.dumps(value)
    return env


class WorkerProcess:
    """One `tierpoint worker` process, its output in `log`: the worker of `node` (or of each of
    several nodes), or with `node=None` the shared worker (workflows, shared and S3 tiers)."""

    def __init__(
        self,
        settings: Settings,
        node: str | Sequence[str] | None,
        log: Path,
        file_size_limit: int | None = None,
        open_files_limit: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`file_size_limit`: the process may write no file larger (RLIMIT_FSIZE): a write past
        it fails with EFBIG, as a write to a full device fails with ENOSPC (Python ignores the
        SIGXFSZ that would otherwise end the process). `open_files_limit`: the descriptors it
        may hold at once (RLIMIT_NOFILE), as a small `ulimit -n` of a node sets it. `env`: more
        variables of its environment (a TMPDIR of its own, whose scratch files a test watches)."""
        self.log = log
        nodes = [node] if isinstance(node, str) else list(node or [])
        args = [a for n in nodes for a in ("--node", n)]
        if nodes:
            args.append("--no-shared")
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "apps.cli.main", "worker", *args],
                cwd=REPO,
                env={**settings_env(settings), **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_limits(file_size_limit, open_files_limit),
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> int:
        """SIGKILL, no chance to clean up or report anything; returns the exit status."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(timeout=60)

    def output(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-4000:]
        return ""


def _limits(size: int | None, files: int | None) -> Callable[[], None] | None:
    if size is None and files is None:
        return None

    def limit() -> None:
        if size is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        if files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

    return limit


@contextlib.contextmanager
def worker_process(
    settings: Settings,
    node: str | Sequence[str] | None,
    log: Path,
    file_size_limit: int | None = None,
    open_files_limit: int | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[WorkerProcess]:
    worker = WorkerProcess(settings, node, log, file_size_limit, open_files_limit, env)
    try:
        yield worker
    finally:
        worker.kill()
