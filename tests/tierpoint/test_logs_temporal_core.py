"""Temporal's core (Rust) logs its own warnings. They must come out as our lines do: JSON in
production, with no colour codes in a file, where before they went straight to stdout coloured."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid

from tests.helpers.worker_process import REPO

# A workflow task that takes over 5 s makes the core warn (TMPRL1104). debug_mode turns off the
# SDK's deadlock detector, which would fail the task at 2 s first.
SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, sys, threading, time
    from temporalio import workflow
    from temporalio.client import Client
    from temporalio.worker import Worker
    from tierpoint import logs

    logs.configure("INFO", json=True)

    @workflow.defn(sandboxed=False)
    class Slow:
        @workflow.run
        async def run(self) -> None:
            time.sleep(5.5)

    class Seen(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.warned = threading.Event()

        def emit(self, record: logging.LogRecord) -> None:
            if "Workflow task duration exceeded" in record.getMessage():
                self.warned.set()

    async def main(address: str, namespace: str, queue: str) -> None:
        seen = Seen()
        logging.getLogger("temporalio.core").addHandler(seen)
        client = await Client.connect(address, namespace=namespace)
        async with Worker(client, task_queue=queue, workflows=[Slow], debug_mode=True):
            await client.execute_workflow(Slow.run, id=queue, task_queue=queue)
            # The core hands its lines over in batches: the last may come after the workflow.
            await asyncio.to_thread(seen.warned.wait, 60)

    asyncio.run(main(*sys.argv[1:]))
    """
)


def test_temporal_core_warnings_are_json_lines_without_colour_codes(
    temporal_address: str, temporal_namespace: str
) -> None:
    queue = f"slow-task-{uuid.uuid4().hex[:8]}"
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, temporal_address, temporal_namespace, queue],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    # Left to itself the core writes to stdout, coloured.
    assert "\x1b[" not in run.stdout + run.stderr, run.stdout + run.stderr
    warned = [
        line
        for line in map(json.loads, filter(None, run.stderr.splitlines()))
        if "Workflow task duration exceeded" in line["event"]
    ]
    assert warned, run.stderr
    assert warned[0]["level"] == "warning" and warned[0]["logger"].startswith("temporalio.core")
