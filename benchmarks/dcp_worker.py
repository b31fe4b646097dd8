"""The training process of the DCP scenario, run in the torch venv (torch, the client and
s3torchconnector; none of the server's packages): one long-lived process that holds the state
dict and times each save or load it is asked for, so torch's import and the state's creation are
paid once.

Protocol: one JSON object per line on stdin, one JSON answer per line on stdout:
  {"op": "init", "mib": N, "tensors": K, "pg_file": PATH, "rank": R, "world": W}
  {"op": "save", "writer": "tierpoint"|"fs"|"s3", "mode": "sync"|"async", "job", "step", "path",
   "shape"}
      -> {"start": epoch seconds, "blocking": s, "total": s}
  {"op": "floor", "path": DIR} -> {"seconds": s}: the tensors' bytes written + fsynced, no DCP
  {"op": "load", "reader": "tierpoint"|"fs"|"s3"|"s3-sequential", "job", "step", "tier", "path",
   "shape", "node", "repopulate"} -> {"seconds": s, "cpu": this process's CPU seconds in the
   load, "cpu_system": of it in the kernel, "equal": bool, "stats": {"files": {path: source},
   "repopulated": [path]} (TierpointReader's)}
One rank of a gloo process group (rank R of W, default a group of one, as a one-process training
job runs DCP). Every rank holds the same state (replicated, as under DDP): a save writes each
tensor once (DCP splits them between the ranks' files), a load reads every tensor on every rank.
The state's shape: "large" (`tensors` tensors of mib/tensors MiB, the default) or "many" (16 MiB
tensors, each followed by a 4 KiB bias, and an int: a model's layers).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from s3torchconnector import S3ClientConfig, S3ReaderConstructor
from s3torchconnector.dcp import S3StorageReader, S3StorageWriter
from tierpoint_client.torch import TierpointReader, TierpointWriter

REGION = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
# moto serves buckets by path, not by virtual host. The client splits every GET into ranged GETs
# of part_size, and moto reads a whole object to answer each one: with the default 8 MiB parts a
# 1 GiB file is read 128 times over (a 256 MiB file loaded in 4.8 s, against 1.0 s with 256 MiB
# parts). Large parts make the baseline as fast as moto allows.
S3_PART = 256 * 1024 * 1024
S3_CONFIG = S3ClientConfig(force_path_style=True, part_size=S3_PART)


def make_state(mib: int, tensors: int, shape: str = "large") -> dict[str, Any]:
    cols = 1024
    g = torch.Generator().manual_seed(0)
    model: dict[str, torch.Tensor] = {}
    if shape == "many":
        # 16 MiB weights (smaller in tiny runs, so that there are several), a bias after each.
        per_mib = min(16, max(1, mib // 4))
        for i in range(max(1, mib // per_mib)):
            model[f"layer{i:03d}.weight"] = torch.randn(per_mib * 256, cols, generator=g)
            model[f"layer{i:03d}.bias"] = torch.randn(cols, generator=g)
    else:
        rows = max(1, mib * 1024 * 1024 // 4 // tensors // cols)
        for i in range(tensors):
            model[f"layer{i:02d}.weight"] = torch.randn(rows, cols, generator=g)
    return {"model": model, "extra": {"step": 7, "lrs": [0.1, 0.01]}}


def blank_like(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
        "extra": {"step": -1, "lrs": [0.0, 0.0]},
    }


def equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    same = all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    return same and a["extra"] == b["extra"]


def writer(cmd: dict[str, Any]) -> Any:
    kind = cmd["writer"]
    if kind == "tierpoint":
        return TierpointWriter(cmd["job"], cmd["step"])
    if kind == "fs":
        return dcp.FileSystemWriter(cmd["path"], sync_files=True)
    return S3StorageWriter(REGION, cmd["path"], s3client_config=S3_CONFIG)


def reader(cmd: dict[str, Any]) -> Any:
    kind = cmd["reader"]
    if kind == "tierpoint":
        return TierpointReader(
            cmd["job"],
            step=cmd["step"],
            tier=cmd.get("tier"),
            node=cmd.get("node"),
            repopulate=cmd.get("repopulate", True),
        )
    if kind == "fs":
        return dcp.FileSystemReader(cmd["path"])
    if kind == "s3-sequential":
        # One stream per file read front to back, as TierpointReader reads whole objects.
        return S3StorageReader(
            REGION,
            cmd["path"],
            s3client_config=S3_CONFIG,
            reader_constructor=S3ReaderConstructor.sequential(),
        )
    return S3StorageReader(REGION, cmd["path"], s3client_config=S3_CONFIG)


def save(state: dict[str, Any], cmd: dict[str, Any]) -> dict[str, Any]:
    w = writer(cmd)
    start = time.time()
    t0 = time.perf_counter()
    if cmd["mode"] == "sync":
        dcp.save(state, storage_writer=w)
        blocking = total = time.perf_counter() - t0
    else:
        pending = dcp.async_save(state, storage_writer=w)
        blocking = time.perf_counter() - t0
        pending.result()
        total = time.perf_counter() - t0
    return {"start": start, "blocking": blocking, "total": total}


def floor(state: dict[str, Any], cmd: dict[str, Any]) -> dict[str, Any]:
    """The disk's floor for a save: every tensor's bytes written to one file in `path` and
    fsynced (with the directory), with no serialisation, planning, checksum or registration."""
    path = cmd["path"]
    t0 = time.perf_counter()
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "state.bin"), "wb", buffering=0) as f:
        for t in state["model"].values():
            f.write(memoryview(t.contiguous().numpy()).cast("B"))
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"seconds": time.perf_counter() - t0}


def load(state: dict[str, Any], cmd: dict[str, Any]) -> dict[str, Any]:
    target = blank_like(state)
    r = reader(cmd)
    many = dist.get_world_size() > 1
    if many:
        dist.barrier()  # every rank starts together; the time is until the last one is done
    # getrusage, not os.times: microseconds, not 10 ms ticks.
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    dcp.load(target, storage_reader=r)
    if many:
        dist.barrier()
    seconds, c1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    answer: dict[str, Any] = {
        "seconds": seconds,
        "cpu": c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime,
        "cpu_system": c1.ru_stime - c0.ru_stime,
        "equal": equal(target, state),
    }
    if isinstance(r, TierpointReader):
        # Where each file came from (`tier`, `tier (ranged)`, `tier (cache)`), and what was written.
        stats = r.stats
        answer["stats"] = {"files": stats.files, "repopulated": stats.repopulated}
    return answer


def main() -> None:
    # DCP and torch warn on stdout's neighbour; our answers own stdout.
    out = sys.stdout
    sys.stdout = sys.stderr
    warnings.simplefilter("ignore")
    states: dict[str, dict[str, Any]] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "init":
            dist.init_process_group(
                "gloo",
                init_method=f"file://{cmd['pg_file']}",
                rank=cmd.get("rank", 0),
                world_size=cmd.get("world", 1),
            )
            answer: dict[str, Any] = {}
            for shape in cmd.get("shapes", ["large"]):
                states[shape] = make_state(cmd["mib"], cmd["tensors"], shape)
                model = states[shape]["model"].values()
                answer[f"bytes_{shape}"] = sum(t.numel() * t.element_size() for t in model)
            answer["bytes"] = answer[f"bytes_{cmd.get('shapes', ['large'])[0]}"]
        elif op == "save":
            answer = save(states[cmd.get("shape", "large")], cmd)
        elif op == "load":
            answer = load(states[cmd.get("shape", "large")], cmd)
        elif op == "floor":
            answer = floor(states["large"], cmd)
        else:
            break
        out.write(json.dumps(answer) + "\n")
        out.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # As the DCP test ranks do: torch 2.13's C++ teardown at exit sometimes aborts once the work
    # is done; skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
