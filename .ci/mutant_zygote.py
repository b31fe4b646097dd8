"""One process that imports the test suite's third-party libraries once, then runs each guard
mutant's pytest in a forked child of itself.

A guard mutant's own tests take a few seconds; importing SQLAlchemy, Temporal, boto3, FastAPI,
Hypothesis and pytest took as long again in every run. Only third-party modules are imported
here, never the project's: each child imports the project from the scratch copy as it is when
the child starts, that is with the mutant applied (the parent rewrites the file before asking).

Protocol, one JSON object per line: stdin {"args": [...], "out": path, "timeout": seconds},
stdout {"rc": int | null} (null: killed at the timeout).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import time
import traceback

PRELOAD = (
    "alembic.command",
    "anyio",
    "boto3",
    "botocore.session",
    "crc32c",
    "fastapi",
    "httpx",
    "hypothesis",
    "prometheus_client",
    "psutil",
    "psycopg",
    "pydantic",
    "pydantic_settings",
    "pytest",
    "rich",
    "sqlalchemy.dialects.postgresql",
    "sqlalchemy.ext.asyncio",
    "sqlalchemy.orm",
    "starlette",
    "structlog",
    "temporalio.activity",
    "temporalio.client",
    "temporalio.worker",
    "temporalio.workflow",
    "typer",
    "uvicorn",
    "yaml",
)
PROJECT = {"activities", "api", "benchmarks", "tests", "tierpoint", "tierpoint_client", "workflows"}


def _preload() -> None:
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    leaked = sorted(m for m in sys.modules if m.split(".", 1)[0] in PROJECT)
    if leaked:
        sys.exit(f"mutant zygote: a preloaded library imported the project: {leaked[:5]}")
    # A fork copies only the calling thread: a library that started threads at import would
    # leave its children with locks nobody releases.
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        sys.exit(f"mutant zygote: {threads} threads after the imports, forking is unsafe")


def _child(args: list[str], out: str) -> None:
    os.setpgid(0, 0)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    code = 3
    try:
        import pytest

        code = int(pytest.main(args))
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run(args: list[str], out: str, timeout: float) -> int | None:
    pid = os.fork()
    if pid == 0:
        _child(args, out)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.05)


def main() -> None:
    _preload()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        rc = _run(request["args"], request["out"], float(request["timeout"]))
        print(json.dumps({"rc": rc}), flush=True)


if __name__ == "__main__":
    main()
