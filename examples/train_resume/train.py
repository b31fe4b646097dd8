"""Train a small model with torchrun, checkpoint it through tierpoint, and resume after a crash.

    source .tierpoint/dev/stack.env
    torchrun --nproc-per-node 2 examples/train_resume/train.py --job demo

Every `--every` steps the ranks save the model, the optimizer and the step with
`dcp.async_save(..., storage_writer=TierpointWriter(...))` and train on while it is written. On
start they load the latest restorable checkpoint of the job, if there is one, and go on from its
step: a run killed at any point and started again ends with the same state, bit for bit, as a run
that was never interrupted. It prints a digest of the state at every checkpoint, after a resume
and at the end, so you can see that for yourself.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from tierpoint_client import Client, NotFoundError
from tierpoint_client.torch import TierpointReader, TierpointWriter
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel


def node_id(local_rank: int) -> str:
    """This rank's tierpoint node. On a cluster all ranks of a host share the host's node id
    (TIERPOINT_NODE); against `tierpoint dev`, rank i plays the dev stack's i-th simulated node
    (its stack.env lists them in TIERPOINT_NODES)."""
    if os.environ.get("TIERPOINT_NODE"):
        return os.environ["TIERPOINT_NODE"]
    return os.environ["TIERPOINT_NODES"].split(",")[local_rank]


def batch(seed: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each batch is a function of (seed, step, rank), so a resumed run trains on the same data
    as an uninterrupted one, with no data-loader or RNG state to checkpoint."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(32, 16, generator=g)
    return x, x.sin().sum(dim=1, keepdim=True)


def state_of(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state, "step": step}


def digest(value: Any, h: Any = None) -> str:
    """sha256 over every tensor's bytes and every other value, in key order."""
    h = h or hashlib.sha256()
    if isinstance(value, torch.Tensor):
        h.update(value.detach().reshape(-1).numpy().tobytes())
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            h.update(str(key).encode())
            digest(value[key], h)
    elif isinstance(value, (list, tuple)):
        for item in value:
            digest(item, h)
    else:
        h.update(repr(value).encode())
    return str(h.hexdigest()[:16])


def say(message: str) -> None:
    if dist.get_rank() == 0:
        print(message, flush=True)


def resume(
    job: str, node: str, model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[int, int]:
    """Load the job's latest restorable checkpoint into model and optimizer. Returns its step (0:
    none) and the job's newest registered step, which may not have become restorable before the
    crash: a step is saved once, so the run trains past it again without saving it."""
    facts: list[Any] = [None, None]
    if dist.get_rank() == 0:  # rank 0 asks, so that every rank takes the same branch
        client = Client.from_env()
        try:
            newest = next(client.checkpoints(job, page_size=1), None)
        except NotFoundError:  # a job that never registered a checkpoint
            newest = None
        facts = [client.latest(job, node=node) is not None, newest.step if newest else 0]
    dist.broadcast_object_list(facts, src=0)
    restorable, newest_step = facts
    if not restorable:
        say(f"{job}: no restorable checkpoint, starting from step 0")
        return 0, newest_step
    state = state_of(model, optimizer, 0)  # the shapes to load into
    reader = TierpointReader(job, node=node)
    dcp.load(state, storage_reader=reader)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )
    step = int(state["step"])
    read = ", ".join(f"{path} from {where}" for path, where in sorted(reader.stats.files.items()))
    say(f"resumed from step {step} (state {digest(state_of(model, optimizer, step))}; read {read})")
    return step, newest_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--job", default="train-resume-demo", help="tierpoint job id")
    p.add_argument("--steps", type=int, default=300, help="train until this step")
    p.add_argument("--every", type=int, default=20, help="checkpoint every N steps")
    p.add_argument("--step-time", type=float, default=0.1, help="sleep per step (time to kill it)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    dist.init_process_group("gloo")
    node = node_id(int(os.environ["LOCAL_RANK"]))
    # Saves run in a background thread: their collectives get a group of their own, so they
    # never interleave with DDP's gradient all-reduces on the default group.
    save_group = dist.new_group(backend="gloo")

    torch.manual_seed(args.seed)  # the same initial weights on every rank and in every run
    net = nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
    )
    model = DistributedDataParallel(net)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    step, saved_before = resume(args.job, node, model, optimizer)
    pending = None
    while step < args.steps:
        step += 1
        x, y = batch(args.seed, step, dist.get_rank())
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.every == 0 and step <= saved_before:
            say(f"step {step}: saved by an earlier run")
        elif step % args.every == 0:
            if pending is not None:
                pending.result()  # one save in flight at a time
            state = state_of(model, optimizer, step)
            say(f"step {step}: loss {loss.item():.6f}, checkpointing (state {digest(state)})")
            writer = TierpointWriter(args.job, step, node=node, metadata={"loss": loss.item()})
            pending = dcp.async_save(state, storage_writer=writer, process_group=save_group)
        time.sleep(args.step_time)
    if pending is not None:
        pending.result()
    say(f"done at step {step} (state {digest(state_of(model, optimizer, step))})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # torch 2.13's C++ teardown sometimes aborts at interpreter exit, after all work is done
    # (docs/pytorch.md, "Known issue"): end without it, so torchrun sees a clean exit.
    sys.stdout.flush()
    os._exit(0)
