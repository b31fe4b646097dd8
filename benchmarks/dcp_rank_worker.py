"""One rank of the dcp_requests scenario, run in the torch venv: a long-lived member of a gloo
group of `--world` processes that saves and loads a small sharded state dict through tierpoint
when asked, so torch's import and the group's set-up are paid once per world size.

Protocol: one JSON object per line on stdin, one JSON answer per line on stdout:
  {"op": "save", "job", "step"} -> {"ok": true}
  {"op": "load", "job"} -> {"ok": true, "step": s, "equal": bool}
  (a failed operation -> {"ok": false, "error": "..."}; DCP fails it on every rank alike)
Every rank is sent the same commands in the same order: they are collective.
"""

from __future__ import annotations

import argparse
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

ROWS, COLS, TENSORS = 64, 256, 4  # 64 rows shard evenly over 1, 2, 4, 8 and 16 ranks


def original(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {f"layer{i}.weight": torch.randn(ROWS, COLS, generator=g) for i in range(TENSORS)}


def sharded(tensors: dict[str, torch.Tensor], mesh: Any) -> dict[str, Any]:
    if mesh is None:
        return dict(tensors)
    return {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in tensors.items()}


def local(value: Any) -> torch.Tensor:
    return value.to_local() if isinstance(value, DTensor) else value


def save(cmd: dict[str, Any], mesh: Any) -> dict[str, Any]:
    state = {"model": sharded(original(cmd["step"]), mesh), "extra": {"step": cmd["step"]}}
    dcp.save(state, storage_writer=TierpointWriter(cmd["job"], cmd["step"]))
    return {"ok": True}


def load(cmd: dict[str, Any], mesh: Any) -> dict[str, Any]:
    blank = {k: torch.zeros(ROWS, COLS) for k in original(0)}
    state = {"model": sharded(blank, mesh), "extra": {"step": -1}}
    reader = TierpointReader(cmd["job"])
    dcp.load(state, storage_reader=reader)
    step = int(state["extra"]["step"])
    want = sharded(original(step), mesh)
    equal = all(torch.equal(local(state["model"][k]), local(want[k])) for k in want)
    return {"ok": True, "step": step, "equal": equal}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--init-file", required=True)
    args = p.parse_args()
    out = sys.stdout
    sys.stdout = sys.stderr  # our answers own stdout
    warnings.simplefilter("ignore")
    dist.init_process_group(
        "gloo", init_method=f"file://{args.init_file}", rank=args.rank, world_size=args.world
    )
    mesh = init_device_mesh("cpu", (args.world,)) if args.world > 1 else None
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            answer = save(cmd, mesh) if cmd["op"] == "save" else load(cmd, mesh)
        except Exception as e:
            answer = {"ok": False, "error": repr(e)[:2000]}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # As dcp_worker.py: torch's C++ teardown at exit sometimes aborts once the work is done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
