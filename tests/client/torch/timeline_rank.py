"""One training process on a job's timeline, run by the tests in the torch venv: it loads (or
finds nothing to load), then saves the steps it is given, as a training script does between a
restart and the next crash. The state is a function of the step (`original`), so what was loaded
is checked. It writes what it saw to --out as JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from tierpoint_client import ConflictError
from tierpoint_client.torch import TierpointReader, TierpointWriter
from torch.distributed.checkpoint.api import CheckpointException


def original(step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(16, 8, generator=g), "step": step}


def blank() -> dict[str, Any]:
    return {"w": torch.full((16, 8), 7.0), "step": -1}


def _load(args: argparse.Namespace, report: dict[str, Any]) -> None:
    reader = TierpointReader(
        args.job, step=args.step, health=args.health, branch=args.branch, rollback=args.rollback
    )
    state = blank()
    if args.plain:
        try:
            dcp.load(state, storage_reader=reader)
        except CheckpointException as e:  # DCP's, a BaseException: what the plain load raises
            # DCP keeps (exception, traceback) per rank, and reports a failed metadata read as
            # an AssertionError that quotes it.
            report["plain_error"] = [str(f[0]) for f in e.failures.values()]
        report["state_untouched"] = torch.equal(state["w"], blank()["w"])
        return
    report["loaded"] = reader.load(state)
    report["state_untouched"] = torch.equal(state["w"], blank()["w"])
    if reader.loaded is not None:
        ref = reader.loaded.ref
        report["loaded_ref"] = [ref.job, ref.step, ref.branch]
        report["right_state"] = torch.equal(state["w"], original(ref.step)["w"])


def _save(args: argparse.Namespace, report: dict[str, Any]) -> None:
    saved = []
    for step in args.save:
        writer = TierpointWriter(args.job, step, metadata={"loss": 1.0 / step})
        try:
            dcp.save(original(step), storage_writer=writer)
        except CheckpointException as e:
            failures = [f[0] for f in e.failures.values()]
            conflict = [f for f in failures if isinstance(f, ConflictError)]
            report["save_refused"] = (
                [step, conflict[0].code, str(conflict[0])]
                if conflict
                else [
                    step,
                    None,
                    repr(failures),
                ]
            )
            break
        body = writer.registered or {}
        parent = body.get("parent") or {}
        saved.append([step, body.get("branch"), parent.get("step"), parent.get("branch")])
    report["saved"] = saved


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--job", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--load", action="store_true", help="load first (TierpointReader.load)")
    p.add_argument("--plain", action="store_true", help="load with plain dcp.load instead")
    p.add_argument("--step", type=int)
    p.add_argument("--branch", type=int)
    p.add_argument("--health")
    p.add_argument("--rollback", action="store_true")
    p.add_argument("--save", type=int, action="append", default=[], help="then save this step")
    args = p.parse_args()
    report: dict[str, Any] = {}
    if args.load or args.plain:
        _load(args, report)
    _save(args, report)
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
    # As dcp_rank.py: torch 2.13's teardown at exit can abort after the work is done and written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
