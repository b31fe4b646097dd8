"""One process of Lightning Fabric saving or loading a checkpoint with `fabric.save(url, state)`
/ `fabric.load(url, state)`, url a `tierpoint://` file; run by the tests in `.venv-trainers`
(under torchrun for DDP). The state is a small model and its SGD-with-momentum optimizer after
STEPS seeded steps, so a loading process knows what it must get back. Writes what it saw to
--out as JSON (a save or load that raises writes the error; the test judges it).

`discard` is no Fabric call: the transaction Lightning's save opens, given up by an exception
after a file was written, straight through fsspec.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import fsspec
import torch
from lightning.fabric import Fabric

STEPS = 3


def trained(fabric: Any, seed: int) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    data = torch.Generator().manual_seed(7)
    for _ in range(STEPS if seed == 0 else 0):
        x = torch.randn(16, 8, generator=data)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
    return model, optimizer


def snapshot(model: Any, optimizer: Any) -> dict[str, list[float]]:
    out = {f"model.{k}": v.flatten().tolist() for k, v in model.state_dict().items()}
    for i, state in optimizer.state_dict()["state"].items():
        out[f"momentum.{i}"] = state["momentum_buffer"].flatten().tolist()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["save", "load", "discard"])
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    fabric = Fabric(accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto")
    fabric.launch()
    report: dict[str, Any] = {"rank": fabric.global_rank}
    try:
        if args.action == "discard":
            fs, path = fsspec.core.url_to_fs(args.url)
            with fs.transaction:
                with fs.open(path, "wb") as f:
                    f.write(b"half a checkpoint")
                raise RuntimeError("the save failed")
        expected = trained(fabric, seed=0)
        if args.action == "save":
            fabric.save(args.url, {"model": expected[0], "optimizer": expected[1]})
        else:
            model, optimizer = trained(fabric, seed=1)  # other weights, no momentum yet
            fabric.load(args.url, {"model": model, "optimizer": optimizer})
            report["same"] = snapshot(model, optimizer) == snapshot(*expected)
    except Exception as e:
        report["error"] = f"{type(e).__name__}: {e}"
    fabric.barrier()
    with open(f"{args.out}.{fabric.global_rank}", "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
