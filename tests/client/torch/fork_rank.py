"""A trainer that forks after a DCP load (a DataLoader's workers, the fork start method), run by
test_dcp_fork.py in the torch venv. It loads the step, forks while a thread of its own holds each
of the client's process-wide locks (as a reader thread does for an instant at each request), loads
the step again in the child, then again itself, and writes what each load got wrong to --out as
JSON. A child that has not answered in HUNG seconds is killed and reported hung."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch.distributed.checkpoint as dcp
from dcp_rank import mismatches, original, template  # type: ignore[import-not-found]
from tierpoint_client import peer, s3
from tierpoint_client.sources import placing
from tierpoint_client.torch import TierpointReader, _choose

HUNG = 120.0


def load(job: str, step: int, tier: str) -> list[str]:
    # Not re-populated: each load reads the tier's copies, not what the one before kept.
    reader = TierpointReader(job, step=step, tier=tier, repopulate=False)
    state = template(step, None)
    dcp.load(state, storage_reader=reader)
    wrong: list[str] = mismatches(state, original(step))
    return wrong


@contextlib.contextmanager
def inside(*locks: Any) -> Iterator[None]:
    """Another thread holds `locks` until the block ends: a fork in it copies them held."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with contextlib.ExitStack() as held:
            for lock in locks:
                held.enter_context(lock)
            taken.set()
            done.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    taken.wait()
    try:
        yield
    finally:
        done.set()
        thread.join()


def in_child(job: str, step: int, tier: str) -> Any:
    answer, send = os.pipe()
    locks = (_choose._requests_lock, placing._pools_lock, s3._S3_CLIENTS_LOCK, peer.PEERS._lock)
    with inside(*locks):
        pid = os.fork()
        if pid == 0:
            os.close(answer)
            try:
                got: Any = load(job, step, tier)
            except BaseException as e:
                got = f"failed: {e!r}"
            os.write(send, json.dumps(got).encode())
            os._exit(0)
    os.close(send)
    try:
        if not select.select([answer], [], [], HUNG)[0]:
            os.kill(pid, signal.SIGKILL)
            return f"hung: no answer in {HUNG:.0f} s"
        with os.fdopen(answer, "rb") as f:
            return json.loads(f.read())
    finally:
        os.waitpid(pid, 0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--tier", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    report = {"parent": load(args.job, args.step, args.tier)}
    report["child"] = in_child(args.job, args.step, args.tier)
    report["parent_again"] = load(args.job, args.step, args.tier)
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
    # As dcp_rank.py: judged by its work, not torch's C++ teardown at interpreter exit.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
