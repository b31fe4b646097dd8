"""Train a small model with torchrun, checkpoint it through tierpoint, and resume after a crash.

    source .tierpoint/dev/stack.env
    torchrun --nproc-per-node 2 examples/train_resume/train.py --job demo
    kill -KILL $(cat .tierpoint/demo.pids)    # a crash of exactly this run
    kill -KILL $(cat .tierpoint/demo.nodes/node-1.pids)    # node-1 fails: its ranks alone
    torchrun ... train.py --job demo --nan-at 130    # the loss goes NaN after a resume
    torchrun ... train.py --job demo --load good --rollback    # back to the newest good one

Every `--every` steps the ranks save the model, the optimizer and the step with
`dcp.async_save(..., storage_writer=TierpointWriter(...))` and train on while it is written. On
start they load the latest restorable checkpoint of the job, if there is one, and go on from its
step: a run killed at any point and started again ends with the same state, bit for bit, as a run
that was never interrupted. It prints a digest of the state at every checkpoint, after a resume
and at the end, so you can see that for yourself (the digests themselves depend on the machine's
CPU kernels, which the first line names; they are the same for a resumed and an uninterrupted
run on one machine).

After a load, a guard (`tierpoint_client.guard.TrainingGuard`) watches the next `--guard-steps`
steps' loss and gradient norm against those the checkpoint recorded: NaN, Inf or a spike marks
the loaded checkpoint bad (it is never loaded again) and the ranks exit with code 75; healthy
steps mark it good. `--load good --rollback` then loads the newest checkpoint certified good and
rolls the job back to it, so the run trains and saves the steps after it again, on a new branch.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import socket
import sys
import time
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from tierpoint_client import Client, NotFoundError
from tierpoint_client.guard import TrainingGuard
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
    nodes = [n for n in os.environ.get("TIERPOINT_NODES", "").split(",") if n]
    if not os.environ.get("TIERPOINT_API_URL") or local_rank >= len(nodes):
        sys.exit(
            "train.py: which tierpoint and which node? Against `tierpoint dev`, first"
            " `source .tierpoint/dev/stack.env` (TIERPOINT_API_URL, TIERPOINT_TOKEN and the"
            f" nodes the ranks play, TIERPOINT_NODES: {len(nodes)} given for local rank"
            f" {local_rank}); on a cluster set TIERPOINT_API_URL, TIERPOINT_TOKEN and this"
            " host's TIERPOINT_NODE."
        )
    return nodes[local_rank]


def record_pids(path: str, node: str) -> list[str]:
    """Write the pids of this run on this host (torchrun's and every local rank's) to `path`, so
    that exactly this run can be killed (`kill -KILL $(cat PATH)`), not everyone's `train.py`;
    and the pids of the ranks that play each tierpoint node to `JOB.nodes/NODE.pids` beside it,
    so that one node's ranks can be killed alone, as when that node fails. Removed when the run
    ends normally, and the node files of an earlier run when this one starts: a stale file must
    not name pids reused by others. Returns the files written."""
    mine = (socket.gethostname(), os.getpid(), os.getppid(), node)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if int(os.environ["LOCAL_RANK"]) != 0:
        return []
    here = [(pid, ppid, n) for host, pid, ppid, n in everyone if host == mine[0]]
    files = {path: sorted({p for pid, ppid, _ in here for p in (pid, ppid)})}
    by_node = path.removesuffix(".pids") + ".nodes"
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(by_node)
    for n in sorted({n for _, _, n in here}):
        files[os.path.join(by_node, f"{n}.pids")] = sorted(p for p, _, of in here if of == n)
    for name, pids in files.items():
        os.makedirs(os.path.dirname(name) or ".", exist_ok=True)
        with open(name + ".tmp", "w") as f:
            f.write(" ".join(map(str, pids)) + "\n")
        os.replace(name + ".tmp", name)
    return list(files)


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


def newest_saved(job: str) -> int:
    """The newest step registered on the job's timeline (0: none), which may not have become
    restorable before the crash: a step is saved once, so the run trains past it again without
    saving it. Steps a rollback superseded are off the timeline: they are saved again."""
    steps: list[Any] = [0]
    if dist.get_rank() == 0:  # rank 0 asks, so that every rank takes the same branch
        client = Client.from_env()
        with contextlib.suppress(NotFoundError):  # a job that never registered a checkpoint
            on_timeline = (c for c in client.checkpoints(job) if c.superseded_by is None)
            steps[0] = next((c.step for c in on_timeline), 0)
    dist.broadcast_object_list(steps, src=0)
    return int(steps[0])


def resume(
    reader: TierpointReader, node: str, model: nn.Module, optimizer: torch.optim.Optimizer
) -> int:
    """Load the job's checkpoint (as `reader` chooses it) into model and optimizer. Returns its
    step, 0 when the job has none (its first run)."""
    state = state_of(model, optimizer, 0)  # the shapes to load into
    if reader.load(state) is None:
        say(f"{reader.job}: no restorable checkpoint, starting from step 0")
        return 0
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )
    step = int(state["step"])
    stats = reader.stats
    read = ", ".join(f"{path} from {where}" for path, where in sorted(stats.files.items()))
    kept = f"; kept {', '.join(sorted(stats.repopulated))} on {node}" if stats.repopulated else ""
    state_now = digest(state_of(model, optimizer, step))
    loaded = reader.loaded
    where = f" of branch {loaded.ref.branch}" if loaded and loaded.ref.branch != 1 else ""
    say(f"resumed from step {step}{where} (state {state_now}; read {read}{kept})")
    return step


def grad_norm(model: nn.Module) -> float:
    """The gradients' global L2 norm (DDP has all-reduced them: the same on every rank)."""
    norms = [p.grad.norm() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--job", default="train-resume-demo", help="tierpoint job id")
    p.add_argument("--steps", type=int, default=300, help="train until this step")
    p.add_argument("--every", type=int, default=20, help="checkpoint every N steps")
    p.add_argument("--step-time", type=float, default=0.1, help="sleep per step (time to kill it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--load",
        choices=["latest", "good"],
        default="latest",
        help="resume from the latest restorable checkpoint, or the newest certified good one",
    )
    p.add_argument(
        "--rollback",
        action="store_true",
        help="roll the job back to the checkpoint loaded: the steps after it are trained and "
        "saved again on a new branch",
    )
    p.add_argument(
        "--guard-steps", type=int, default=5, help="steps the guard watches after a load"
    )
    p.add_argument("--nan-at", type=int, help="make the weights NaN at this step (a divergence)")
    p.add_argument(
        "--pid-file",
        help="where this run's pids go (default: .tierpoint/JOB.pids, from the current dir)",
    )
    args = p.parse_args()
    pid_file = args.pid_file or os.path.join(".tierpoint", f"{args.job}.pids")

    node = node_id(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("gloo")
    pid_files = record_pids(pid_file, node)
    # Saves run in a background thread: their collectives get a group of their own, so they
    # never interleave with DDP's gradient all-reduces on the default group.
    save_group = dist.new_group(backend="gloo")

    torch.manual_seed(args.seed)  # the same initial weights on every rank and in every run
    net = nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
    )
    model = DistributedDataParallel(net)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    # The digests are this machine's: PyTorch picks CPU kernels by instruction set (AVX-512, AVX2,
    # ...; ATEN_CPU_CAPABILITY chooses), and their float results differ in the last bits. What
    # holds everywhere: a resumed run ends on the digest of a run of the same job that never
    # stopped, on the same machine and kernels.
    say(f"torch {torch.__version__}, CPU kernels {torch.backends.cpu.get_cpu_capability()}")
    health: Literal["good"] | None = "good" if args.load == "good" else None
    reader = TierpointReader(args.job, node=node, health=health, rollback=args.rollback)
    step = resume(reader, node, model, optimizer)
    saved_before = newest_saved(args.job)
    guard = TrainingGuard(reader.loaded, steps=args.guard_steps)
    pending = None
    while step < args.steps:
        step += 1
        if step == args.nan_at:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))
        x, y = batch(args.seed, step, dist.get_rank())
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        norm = grad_norm(model)
        guard.check(step, loss=loss.item(), grad_norm=norm)
        optimizer.step()
        if step % args.every == 0 and step <= saved_before:
            say(f"step {step}: saved by an earlier run")
        elif step % args.every == 0:
            if pending is not None:
                pending.result()  # one save in flight at a time
            state = state_of(model, optimizer, step)
            say(f"step {step}: loss {loss.item():.6f}, checkpointing (state {digest(state)})")
            recorded = {"loss": loss.item(), "grad_norm": norm}  # what a guard compares with
            writer = TierpointWriter(args.job, step, node=node, metadata=recorded)
            pending = dcp.async_save(state, storage_writer=writer, process_group=save_group)
        time.sleep(args.step_time)
    if pending is not None:
        pending.result()
    say(f"done at step {step} (state {digest(state_of(model, optimizer, step))})")
    dist.destroy_process_group()
    for name in pid_files:
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)
    if pid_files:
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(pid_files[-1]))  # JOB.nodes, now empty


if __name__ == "__main__":
    main()
    # torch 2.13's C++ teardown sometimes aborts at interpreter exit, after all work is done
    # (docs/pytorch.md, "Known issue"): end without it, so torchrun sees a clean exit.
    sys.stdout.flush()
    os._exit(0)
