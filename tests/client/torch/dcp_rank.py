"""One rank of a DCP save or load through tierpoint, run by the tests in the torch venv
(`.venv-torch`, which has torch and the client but none of the server's packages).

The state is a function of the step, so a loading rank knows what it must get back. With two
ranks the large tensors are DTensors sharded over a CPU mesh; a single rank loads them as plain
full tensors, which is DCP resharding. The rank writes what it saw (step, mismatches, warnings) to
--out as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import json
import os
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from tierpoint_client.torch import TierpointReader, TierpointWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor


def original(step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {
            "w": torch.randn(64, 33, generator=g),
            "emb": torch.randint(0, 1000, (10, 4), generator=g),
            "half": torch.randn(8, 6, generator=g).to(torch.bfloat16),
            "bias": torch.randn(17, generator=g),
        },
        "extra": {"step": step, "name": f"run-{step}", "lrs": [0.1, 0.01 * step], "on": True},
    }


SHARDED = {"w": 0, "emb": 0, "half": 1}  # tensor -> sharded dimension, with two ranks


def template(step: int, mesh: Any) -> dict[str, Any]:
    """What a resuming job holds before the load: the right shapes, other values."""
    state = original(step)
    model = {}
    for name, t in state["model"].items():
        blank = torch.full_like(t, 7)
        if mesh is not None and name in SHARDED:
            model[name] = distribute_tensor(blank, mesh, [Shard(SHARDED[name])])
        else:
            model[name] = blank
    return {"model": model, "extra": {"step": -1, "name": "", "lrs": [0.0, 0.0], "on": False}}


def distributed(state: dict[str, Any], mesh: Any) -> dict[str, Any]:
    if mesh is None:
        return state
    model = {
        k: distribute_tensor(v, mesh, [Shard(SHARDED[k])]) if k in SHARDED else v
        for k, v in state["model"].items()
    }
    return {"model": model, "extra": state["extra"]}


def mismatches(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    bad = []
    for name, expected in want["model"].items():
        value = got["model"][name]
        full = value.full_tensor() if isinstance(value, DTensor) else value
        if full.dtype != expected.dtype or not torch.equal(full, expected):
            bad.append(f"model.{name}")
    for name, expected in want["extra"].items():
        if got["extra"][name] != expected:
            bad.append(f"extra.{name}: {got['extra'][name]!r} != {expected!r}")
    return bad


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["save", "async_save", "load"])
    p.add_argument("--job", required=True)
    p.add_argument("--step", type=int)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--init-file")
    p.add_argument("--tier")
    p.add_argument("--only", help="load only this model tensor (a partial load)")
    p.add_argument("--no-repopulate", action="store_true")
    p.add_argument("--min-ranged-size", type=int)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--disagree",
        metavar="RANK:JOB/STEP",
        action="append",
        default=[],
        help="this rank saves JOB/STEP instead (a job whose ranks disagree on what they save)",
    )
    args = p.parse_args()
    for spec in args.disagree:
        rank, _, target = spec.partition(":")
        if int(rank) == args.rank:
            job, _, step = target.rpartition("/")
            args.job, args.step = job, int(step)
    # A crash in torch's C++ (SIGABRT) then still shows where each Python thread was.
    faulthandler.enable(all_threads=True)

    mesh = None
    if args.world > 1:
        dist.init_process_group(
            "gloo", init_method=f"file://{args.init_file}", rank=args.rank, world_size=args.world
        )
        mesh = init_device_mesh("cpu", (args.world,))
    report: dict[str, Any] = {"rank": args.rank}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if args.action in ("save", "async_save"):
            state = distributed(original(args.step), mesh)
            writer = TierpointWriter(args.job, args.step, metadata={"saved_by": "dcp_rank"})
            if args.action == "save":
                dcp.save(state, storage_writer=writer)
            else:
                pending = dcp.async_save(state, storage_writer=writer)
                # Training goes on once the state is staged: what was staged must be saved, not
                # what the state holds when the background write runs.
                for t in state["model"].values():
                    t.add_(1)
                state["extra"]["name"] = "changed after staging"
                pending.result()
            report["registered"] = writer.registered is not None
        else:
            options: dict[str, Any] = {"repopulate": not args.no_repopulate}
            if args.min_ranged_size is not None:
                options["min_ranged_size"] = args.min_ranged_size
            reader = TierpointReader(args.job, step=args.step, tier=args.tier, **options)
            # The template's shapes come from the step the test expects; values all differ.
            state = template(args.step if args.step is not None else 0, mesh)
            if args.only is not None:
                state = {"model": {args.only: state["model"][args.only]}}
            dcp.load(state, storage_reader=reader)
            assert reader.chosen is not None
            report["step"] = reader.chosen.step
            want = original(reader.chosen.step)
            if args.only is not None:
                want = {"model": {args.only: want["model"][args.only]}, "extra": {}}
            report["mismatches"] = mismatches(state, want)
            report["lease_released"] = reader.chosen.lease_id is None
            report["stats"] = dataclasses.asdict(reader.stats)
    # Ours only: DCP warns of its own matters (e.g. a load without a process group).
    report["warnings"] = [str(w.message) for w in caught if str(w.message).startswith("tierpoint:")]
    if args.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
    # torch 2.13's C++ teardown at interpreter exit intermittently aborts ("terminate called
    # without an active exception", no Python frame left: after main returned, the report
    # written and the process group destroyed). The rank's work is complete and checked by then;
    # exit without running C++ static destructors so the test judges the work, not the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
