"""What trainers do to a `tierpoint://` filesystem, one scenario per run, in the torch venv (where
fsspec finds the protocol through the client's entry point). Each scenario writes the facts it saw
to --out as JSON; the tests (test_fsspec_conformance.py) judge them against the stack.

A file's bytes are a function of (step, name), so a reader knows what it must get back.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import pickle
import random
import re
import sys
import warnings
from collections.abc import Callable
from typing import Any

import fsspec
from tierpoint_client import Client, NotFoundError
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, MetadataIndex

DATA = "__0_0.distcp"
SIZE = 300_000


def content(step: int, name: str) -> bytes:
    return random.Random(f"{step}/{name}").randbytes(SIZE)


def dcp_metadata(name: str, size: int) -> bytes:
    """The `.metadata` DCP's FsspecWriter writes for one item stored in `name`."""
    index = MetadataIndex("blob")
    return pickle.dumps(
        Metadata(
            state_dict_metadata={"blob": BytesStorageMetadata()},
            storage_data={index: _StorageInfo(name, 0, size)},
        )
    )


def registered(client: Client, job: str, step: int) -> dict[str, Any] | None:
    try:
        cp = client.checkpoint(job, step)
    except NotFoundError:
        return None
    return {s.path: [s.size, s.node] for s in cp.shards or ()}


def stage(fs: Any, job: str, step: int) -> None:
    """What every rank of a DCP save does: the step folder, then its data file."""
    fs.makedirs(f"tierpoint://{job}/step-{step}", exist_ok=True)
    with fs.open(f"tierpoint://{job}/step-{step}/{DATA}", "wb") as f:
        data = content(step, DATA)
        for at in range(0, SIZE, 7000):  # many small writes, a flush after each
            f.write(data[at : at + 7000])
            f.flush()
        os.fsync(f.fileno())
        f.close()  # DCP closes twice


def commit(fs: Any, client: Client, job: str, step: int) -> dict[str, Any]:
    stage(fs, job, step)
    base = f"tierpoint://{job}/step-{step}"
    with fs.open(f"{base}/.metadata.tmp", "wb") as f:
        f.write(dcp_metadata(DATA, SIZE))
    before = {
        "registered": registered(client, job, step),
        "metadata_exists": fs.exists(f"{base}/.metadata"),
    }
    fs.rename(f"{base}/.metadata.tmp", f"{base}/.metadata")
    return {"before": before, "after": registered(client, job, step)}


def per_rank_commit(fs: Any, job: str, step: int) -> str:
    """DCP without collectives: rank 0 renames its own `__0.metadata.tmp`."""
    base = f"tierpoint://{job}/step-{step}"
    with fs.open(f"{base}/__0.metadata.tmp", "wb") as f:
        f.write(dcp_metadata(DATA, SIZE))
    return outcome(lambda: fs.rename(f"{base}/__0.metadata.tmp", f"{base}/__0.metadata"))


def listing(fs: Any, job: str, committed: int, uncommitted: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for form in (f"tierpoint://{job}", job):  # DCP's full URLs, torchtitan's stripped paths
        folder = f"{form}/step-{committed}"
        out[form] = {
            "exists": fs.exists(form),
            "isdir": fs.isdir(form),
            "ls": fs.ls(form, detail=False),
            "step_isdir": fs.isdir(folder),
            "step_ls": fs.ls(folder, detail=True),
            "metadata_isfile": fs.isfile(f"{folder}/.metadata"),
            "uncommitted_exists": fs.exists(f"{form}/step-{uncommitted}"),
            "uncommitted_metadata": fs.isfile(f"{form}/step-{uncommitted}/.metadata"),
            "load_step": find_load_step(fs, form),
        }
    out["other_job_exists"] = fs.exists(f"{job}-never-saved")
    # A refused token is an error, never "no checkpoint" (a trainer would start afresh).
    refused = fsspec.filesystem("tierpoint", token="not-a-token", skip_instance_cache=True)
    folder = f"{job}/step-{committed}"
    out["refused"] = {
        "exists": outcome(lambda: refused.exists(folder)),
        "isdir": outcome(lambda: refused.isdir(folder)),
        "isfile": outcome(lambda: refused.isfile(f"{folder}/.metadata")),
    }
    return out


def find_load_step(fs: Any, folder: str) -> int:
    """torchtitan's `_find_load_step`: list the folder, keep the `step-N` holding `.metadata`."""
    steps = []
    for name in fs.ls(folder, detail=False):
        m = re.search(r"step-(\d+)$", name.rsplit("/", 1)[-1])
        if m and fs.isfile(f"{folder}/step-{m[1]}/.metadata"):
            steps.append(int(m[1]))
    return max(steps, default=-1)


def reads(fs: Any, job: str, step: int) -> dict[str, Any]:
    want = content(step, DATA)
    rng = random.Random(1)
    bad = []
    with fs.open(f"{job}/step-{step}/{DATA}", "rb") as f:
        for _ in range(200):  # DCP's reads: seek anywhere, read or readinto a piece
            at, n = rng.randrange(SIZE), rng.randrange(1, 20_000)
            f.seek(at)
            if rng.random() < 0.5:
                got = f.read(n)
            else:
                buf = bytearray(n)
                got = bytes(buf[: f.readinto(buf)])
            if got != want[at : at + n] or f.tell() != at + len(got):
                bad.append([at, n])
        f.seek(0)
        whole = f.read()
    with fs.open(f"tierpoint://{job}/step-{step}/.metadata", "rb") as f:
        metadata = pickle.loads(f.read())
    return {
        "mismatches": bad,
        "whole": whole == want,
        "metadata_names": sorted(i.relative_path for i in metadata.storage_data.values()),
    }


def purge(fs: Any, job: str, old: int, newest: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, call in {
        "committed_file": lambda: fs.rm(f"{job}/step-{newest}/{DATA}"),
        "newest": lambda: fs.rm(f"tierpoint://{job}/step-{newest}", recursive=True),
        "missing": lambda: fs.rm(f"{job}/step-{newest + 100}", recursive=True),
        "old": lambda: fs.rm(f"{job}/step-{old}", recursive=True),
    }.items():
        out[name] = outcome(call)
    out["ls"] = fs.ls(job, detail=False)
    return out


def outcome(call: Callable[[], Any]) -> str:
    try:
        call()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "ok"


def transaction(fs: Any, job: str, step: int) -> dict[str, Any]:
    """Lightning's `_atomic_save`: a file opened inside `fs.transaction`, committed (and the
    step registered) at its end; then another step's, given up."""
    path = f"tierpoint://{job}/step-{step}/state.ckpt"
    directory = local_dir(job, step)
    out: dict[str, Any] = {}
    fs.makedirs(f"{job}/step-{step}", exist_ok=True)
    with fs.transaction:
        with fs.open(path, "wb") as f:
            f.write(content(step, "state.ckpt"))
        out["in_transaction"] = sorted(os.listdir(directory))
    out["committed"] = sorted(os.listdir(directory))
    shards = Client.from_env().checkpoint(job, step).shards or ()
    out["registered"] = sorted(s.path for s in shards)
    try:
        with fs.transaction:
            with fs.open(f"{job}/step-{step + 1}/discarded.ckpt", "wb") as f:
                f.write(b"never kept")
            raise RuntimeError("the save failed")
    except RuntimeError:
        pass
    discarded = local_dir(job, step + 1)
    out["after_discard"] = sorted(os.listdir(discarded)) if os.path.exists(discarded) else []
    with open(os.path.join(directory, "state.ckpt"), "rb") as r:
        out["bytes_ok"] = r.read() == content(step, "state.ckpt")
    return out


def local_dir(job: str, step: int) -> str:
    client = Client.from_env()
    root = next(t.root for t in client.tiers() if t.kind == "local" and t.root)
    return os.path.join(root.replace("{node}", os.environ["TIERPOINT_NODE"]), job, str(step))


def run(name: str, fs: Any, client: Client, job: str, steps: list[int]) -> dict[str, Any]:
    if name == "commit":
        return commit(fs, client, job, steps[0])
    if name == "stage":
        stage(fs, job, steps[0])
        return {"per_rank_commit": per_rank_commit(fs, job, steps[0])}
    if name == "listing":
        return listing(fs, job, steps[0], steps[1])
    if name == "reads":
        return reads(fs, job, steps[0])
    if name == "purge":
        return purge(fs, job, steps[0], steps[1])
    return transaction(fs, job, steps[0])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("scenario")
    p.add_argument("--job", required=True)
    p.add_argument("--steps", type=int, nargs="+", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    fs = fsspec.filesystem("tierpoint")
    client = Client.from_env()
    job, steps = args.job, args.steps
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        facts = run(args.scenario, fs, client, job, steps)
    facts["warnings"] = [str(w.message) for w in caught if "tierpoint" in str(w.message)]
    with open(args.out, "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main()
    atexit._run_exitfuncs()  # release the restore leases, as an ordinary exit does
    sys.stdout.flush()
    os._exit(0)
