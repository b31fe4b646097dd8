"""One rank of a DCP save or load by URL, `checkpoint_id="tierpoint://<job>/step-<N>"`, with no
writer or reader object: DCP picks its fsspec storage by itself, and fsspec finds `tierpoint://`
through the client's entry point. Run by the tests in the torch venv; the state is dcp_rank's (a
function of the step, DTensors sharded over the ranks with two), so a loading rank knows what it
must get back. Writes what it saw to --out as JSON; a rank whose save or load raises writes the
error instead (and exits 0: the test judges it).
"""

from __future__ import annotations

import argparse
import atexit
import faulthandler
import json
import os
import posixpath
import re
import sys
import warnings
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

# The script's own folder is on its path (no `tests` package in the torch venv).
from dcp_rank import distributed, mismatches, original, template  # type: ignore[import-not-found]
from fsspec.core import url_to_fs
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.device_mesh import init_device_mesh


def resume_step(folder: str) -> int:
    """The step torchtitan (0.3.0, its CheckpointManager's load) resumes from `folder`, asked
    of the filesystem exactly as it asks, on every rank: whether the folder exists, whether it
    is a folder, its listing, two probes per `step-N` entry (DCP's `.metadata`, HF's index),
    and whether the chosen step is a folder. -1: none."""
    fs, path = url_to_fs(folder)
    if not fs.exists(path) or not fs.isdir(path):
        return -1
    steps = []
    for entry in fs.ls(path, detail=False):
        name = posixpath.basename(entry.rstrip("/"))
        m = re.search(r"step-(\d+)", name)
        if m is None:
            continue
        dcp_file = fs.isfile(posixpath.join(path, name, ".metadata"))
        hf_file = fs.isfile(posixpath.join(path, name, "model.safetensors.index.json"))
        if dcp_file or hf_file:
            steps.append(int(m[1]))
    step = max(steps, default=-1)
    if step >= 0 and not fs.isdir(posixpath.join(path, f"step-{step}")):
        raise FileNotFoundError(f"step-{step}")
    return step


def main() -> None:
    p = argparse.ArgumentParser()
    actions = ["save", "async_save", "process_save", "load", "folder_save", "resume"]
    p.add_argument("action", choices=actions)
    p.add_argument("--url", required=True, help="folder_save: a folder, `{node}` its node's id")
    p.add_argument("--step", type=int, required=True, help="the state's step")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--init-file")
    p.add_argument("--out", required=True)
    args = p.parse_args()
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
        try:
            if args.action == "resume":
                step = resume_step(args.url)
                report["resumed"] = step
                state = template(step, mesh)
                dcp.load(state, checkpoint_id=f"{args.url}/step-{step}")
                report["mismatches"] = mismatches(state, original(step))
            elif args.action == "load":
                state = template(args.step, mesh)
                dcp.load(state, checkpoint_id=args.url)
                report["mismatches"] = mismatches(state, original(args.step))
            elif args.action == "save":
                dcp.save(distributed(original(args.step), mesh), checkpoint_id=args.url)
            elif args.action == "folder_save":
                # DCP's own files in a plain folder, as every save by URL wrote them before
                # tierpoint:// recorded its files as TierpointWriter does.
                writer = FileSystemWriter(args.url.replace("{node}", os.environ["TIERPOINT_NODE"]))
                dcp.save(distributed(original(args.step), mesh), storage_writer=writer)
            else:
                state = distributed(original(args.step), mesh)
                # A process-based save writes from a fresh interpreter per rank, which knows
                # tierpoint:// only through the entry point.
                kind = "PROCESS" if args.action == "process_save" else "THREAD"
                pending = dcp.async_save(
                    state,
                    checkpoint_id=args.url,
                    async_checkpointer_type=AsyncCheckpointerType[kind],
                )
                for t in state["model"].values():
                    t.add_(1)  # training goes on: what was staged is what is saved
                pending.result()
        except BaseException as e:  # DCP raises CheckpointException, a BaseException
            report["error"] = f"{type(e).__name__}: {e}"
    report["warnings"] = [str(w.message) for w in caught if "tierpoint" in str(w.message)]
    if args.world > 1:
        dist.barrier()
        dist.destroy_process_group()
    with open(args.out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
    # As dcp_rank: skip torch's C++ teardown (it intermittently aborts at exit), but run what
    # an ordinary exit runs (the filesystem releases its restore leases then).
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
