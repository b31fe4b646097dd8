"""torchtitan's own checkpointing, its save and its load, to its local folder and through
`--checkpoint.folder tierpoint://<job>`, side by side in the same run, and the tierpoint API's
requests per save and per load (counted by the server, as dcp_requests counts DCP's).

Each run is two torchtitan runs (examples/torchtitan/cpu_launch.py under torchrun, in
`.venv-trainers`, the debug model on CPU): one of STEPS steps that saves once, at its last step,
and one started again with the same folder and `--checkpoint.load-only`, which finds that step
and loads it (its training loop then has nothing left to do, and it saves nothing). The times are
torchtitan's own, from its log ("Last step checkpoint completed in", "Finished loading the
checkpoint in": the save and the load alone, without the process's start-up); the requests are
the API's count over each whole run, so the load's include torchtitan's resume probes (a listing
of the job and two probes per step folder, made by every rank and asked of the API by the
coordinator alone). Untimed between the two: the checkpoint becomes restorable on the local tier.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

from tierpoint_client import Client

from benchmarks.env import ROOT, Env, bootstrap_module, subprocess_env
from benchmarks.harness import Method, Outcome, Row, Scenario, Watched
from benchmarks.scenarios.dcp_requests import settled_requests

LAUNCHER = ROOT / "examples" / "torchtitan" / "cpu_launch.py"
MAKE_ASSETS = ROOT / "examples" / "torchtitan" / "make_assets.py"
STEPS = 2
WAIT = 600  # hang guard
_SAVE = re.compile(r"Last step checkpoint completed in ([0-9.]+)s")
_LOAD = re.compile(r"Finished loading the checkpoint in ([0-9.]+) seconds")
LOCAL, URL = "local folder", "tierpoint://"


def _seconds(pattern: re.Pattern[str], log: Path) -> float:
    found = pattern.findall(log.read_text(errors="replace"))
    if not found:
        raise RuntimeError(f"torchtitan logged no {pattern.pattern!r}: see {log}")
    return max(float(s) for s in found)  # the slowest rank's


class Torchtitan(Scenario):
    name = "torchtitan"
    summary = "torchtitan's save and load: its local folder vs tierpoint://, and API requests"

    def __init__(self, env: Env, world: int) -> None:
        self.env, self.world = env, world
        self.work = env.work / self.name
        self.runs = 0

    def params(self) -> dict[str, Any]:
        return {
            "model": "torchtitan 0.3.0 llama3_debugmodel on CPU (seq 256, batch 2)",
            "ranks": self.world,
            "save": f"the last step of a {STEPS}-step run, synchronous",
        }

    def watched(self) -> Watched:
        return dict(self.stack.pids()) if getattr(self, "stack", None) is not None else {}

    def prepare(self) -> list[Method]:
        bootstrap = bootstrap_module()
        if not bootstrap.sync_trainers_venv():
            raise RuntimeError(f"{bootstrap.TRAINERS_VENV.name}/ could not be built")
        self.python = Path(bootstrap._venv_bin(bootstrap.TRAINERS_VENV, "python"))
        self.work.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(self.python), str(MAKE_ASSETS), str(self.work)], check=True)
        self.stack = self.env.stack()
        info = self.stack.info
        assert info is not None and info.metrics_url is not None
        self.metrics_url = info.metrics_url
        self.client = Client(info.api_url, token=info.token)
        self.run_env = subprocess_env(
            {
                "TIERPOINT_API_URL": info.api_url,
                "TIERPOINT_TOKEN": info.token or "",
                "TIERPOINT_NODE": sorted(info.nodes)[0],
                "OMP_NUM_THREADS": "1",
                "HF_HOME": str(self.work / "hf"),
                "TMPDIR": str(self.work),
                # A load builds a source for every copy, S3's included, before it reads the
                # local one: without the keys the stack's S3 tier names, it fails.
                **info.s3.credential_vars(),
            }
        )
        save, load = "torchtitan save", "torchtitan load"
        return [
            Method(
                LOCAL,
                self._local,
                (Row(f"{save}, {LOCAL}", "save"), Row(f"{load}, {LOCAL}", "load")),
            ),
            Method(
                URL,
                self._tierpoint,
                (
                    Row(f"{save}, {URL}", "save", f"{save}, {LOCAL}"),
                    Row(f"{load}, {URL}", "load", f"{load}, {LOCAL}"),
                    # TierpointWriter's is 3 per save at any world size.
                    Row(f"API requests per {save}", "save_requests", unit="n"),
                    Row(
                        f"API requests per {load} (its resume probes included)",
                        "load_requests",
                        unit="n",
                    ),
                ),
            ),
        ]

    def _titan(self, folder: str, name: str, *, load: bool = False) -> Path:
        log = self.work / f"{name}.log"
        cmd = [str(self.python), "-m", "torch.distributed.run", "--standalone"]
        cmd += [f"--nproc_per_node={self.world}", str(LAUNCHER)]
        cmd += ["--module", "llama3", "--config", "llama3_debugmodel", "--dump-folder", "out"]
        cmd += ["--training.steps", str(STEPS), "--training.seq-len", "256"]
        cmd += ["--training.local-batch-size", "2", "--validator.no-enable"]
        cmd += ["--parallelism.spmd-backend", "partial_dtensor"]
        cmd += ["--checkpoint.enable", "--checkpoint.folder", folder]
        if load:  # it would save its last step again, a step tierpoint has registered
            cmd += ["--checkpoint.load-only"]
        with open(log, "wb") as out:
            done = subprocess.run(
                cmd,
                cwd=self.work,
                env=self.run_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=WAIT,
            )
        if done.returncode != 0:
            raise RuntimeError(f"torchtitan exited with {done.returncode}: see {log}")
        return log

    def _local(self) -> Outcome:
        self.runs += 1
        folder = str(self.work / f"local-{self.runs}")
        saved = self._titan(folder, f"local-{self.runs}-save")
        loaded = self._titan(folder, f"local-{self.runs}-load", load=True)
        return Outcome({"save": _seconds(_SAVE, saved), "load": _seconds(_LOAD, loaded)})

    def _tierpoint(self) -> Outcome:
        self.runs += 1
        job = f"titan-bench-{uuid.uuid4().hex[:8]}"
        before = settled_requests(self.metrics_url)
        saved = self._titan(f"tierpoint://{job}", f"{job}-save")
        after_save = settled_requests(self.metrics_url)
        self.client.wait_restorable(job, STEPS, "ssd", WAIT, 0.2)
        before_load = settled_requests(self.metrics_url)
        loaded = self._titan(f"tierpoint://{job}", f"{job}-load", load=True)
        after_load = settled_requests(self.metrics_url)
        return Outcome(
            {
                "save": _seconds(_SAVE, saved),
                "load": _seconds(_LOAD, loaded),
                "save_requests": after_save - before,
                "load_requests": after_load - before_load,
            }
        )
