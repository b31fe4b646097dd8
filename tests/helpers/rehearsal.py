"""A deploy rehearsal without a cluster: the containers of the rendered Kubernetes manifests run as
local processes, with their command, arguments and environment read from the manifests. What only
a cluster has is mapped to a local stand-in in one place, `Cluster`, and nothing else changes:

- the image: its ENTRYPOINT `tierpoint` (Dockerfile) is the project's console script, and its
  PATH holds the venv's `bin`;
- Secrets (`secretKeyRef`) and the downward API's `spec.nodeName`: values given per (name, key)
  and per simulated node;
- the ConfigMap's tierpoint.toml: written to a local file at the config volume's place, with the
  cluster-only values of the TOML replaced: the Temporal frontend's and the S3 bucket's names,
  and the tiers' roots (the node's hostPath and the shared claim) as local directories;
- container ports: each process gets free local ports for the ports it declares (two API replicas
  on one machine), and binds 127.0.0.1 where the pod binds 0.0.0.0;
- IRSA: the S3 stand-in's keys as AWS_* variables;
- a new image: a second copy of the code's packages (`copy_build`), run with the same venv;
- a Service's endpoints during a rolling update (`Endpoints`);
- the kubelet stopping a container: its preStop hook, then SIGTERM (`stop_as_kubelet`).
"""

from __future__ import annotations

import compileall
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apps.devstack.services import free_port, stop_popen
from tests.helpers.kustomize import Obj

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = ["tierpoint"]  # the Dockerfile's
WAIT = 180.0  # hang guard only
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_PORT_FLAGS = ("--port", "--metrics-port")
_HOST_FLAGS = ("--host", "--metrics-host")
# What the image carries of the repository: the service's packages and the client's.
BUILD_PACKAGES = (
    "tierpoint",
    "api",
    "apps",
    "activities",
    "workflows",
    "migrations",
    "client/tierpoint_client",
)


@dataclass
class Cluster:
    """The local stand-ins of everything only a cluster has."""

    work: Path
    temporal_address: str
    temporal_namespace: str
    s3_endpoint_url: str
    s3_bucket: str
    aws: dict[str, str]  # IRSA's stand-in: AWS_ACCESS_KEY_ID, ...
    secrets: dict[tuple[str, str], str]  # (Secret name, key) -> value
    services: dict[str, str] = field(default_factory=dict)  # cluster URL -> local URL

    def host_dir(self, node: str, path: str) -> Path:
        """A hostPath of a simulated node."""
        return self.work / "hosts" / node / path.lstrip("/")

    def claim_dir(self, claim: str) -> Path:
        return self.work / "claims" / claim


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined variables replaced, `$$` a `$`, the rest kept."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(one, value)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"not rehearsed in tierpoint.toml: {value!r}")


def _dump_toml(data: dict[str, Any]) -> str:
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if k != "tiers"]
    for tier in data.get("tiers", []):
        lines += ["", "[[tiers]]", *(f"{k} = {_toml_value(v)}" for k, v in tier.items())]
    return "\n".join(lines) + "\n"


def local_config(objects: list[Obj], cluster: Cluster, pvc_mounts: dict[str, str]) -> Path:
    """The ConfigMap's tierpoint.toml with its cluster-only values mapped (see the module doc);
    `pvc_mounts`: mount path -> claim name, as the workers mount them."""
    config = next(o for o in objects if o["kind"] == "ConfigMap" and "tierpoint.toml" in o["data"])
    data = tomllib.loads(config["data"]["tierpoint.toml"])
    data["temporal_address"] = cluster.temporal_address
    data["temporal_namespace"] = cluster.temporal_namespace
    for tier in data["tiers"]:
        if tier["kind"] == "local":
            # Each node's hostPath at the same path: {node} is each process's node.
            tier["root"] = str(cluster.host_dir("{node}", tier["root"]))
        elif tier["kind"] == "shared":
            tier["root"] = str(cluster.claim_dir(pvc_mounts[tier["root"]]))
        elif tier["kind"] == "s3":
            tier["bucket"] = cluster.s3_bucket
            tier["endpoint_url"] = cluster.s3_endpoint_url
    name: str = config["metadata"]["name"]
    path = cluster.work / "config" / name / "tierpoint.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_dump_toml(data))
    return path


@dataclass
class Proc:
    """One container as a local process."""

    name: str
    argv: list[str]
    env: dict[str, str]
    ports: dict[str, int]  # declared container port (number or name) -> local port
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.log.parent,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def run(self) -> int:
        """To completion (a Job's or an init container's)."""
        self.start()
        assert self.popen is not None
        return self.popen.wait(timeout=WAIT)

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        stop_popen(self.popen, 30)


def container_process(
    pod: Obj, container: Obj, cluster: Cluster, config: Path, node: str, tag: str
) -> Proc:
    """`container` of pod spec `pod`, on simulated `node`, as a local process."""
    mounts = {v["name"]: v for v in pod.get("volumes", [])}
    env: dict[str, str] = {}
    for item in container.get("env", []):
        value = _env_value(item, env, cluster, node)
        if value is not None:
            env[item["name"]] = value
    for mount in container.get("volumeMounts", []):
        volume = mounts[mount["name"]]
        if "configMap" in volume:
            # The config volume: its one file, at the local copy's place.
            env = {
                k: str(config) if v.startswith(mount["mountPath"] + "/") else v
                for k, v in env.items()
            }
    ports: dict[str, int] = {}
    for port in container.get("ports", []):
        local = free_port()
        ports[str(port["containerPort"])] = local
        if "name" in port:
            ports[port["name"]] = local
    argv = [*(container.get("command") or ENTRYPOINT), *container.get("args", [])]
    argv = [expand(a, env) for a in argv]
    for i, arg in enumerate(argv[:-1]):
        if arg in _PORT_FLAGS and argv[i + 1] in ports:
            argv[i + 1] = str(ports[argv[i + 1]])
        if arg in _HOST_FLAGS and argv[i + 1] == "0.0.0.0":
            argv[i + 1] = "127.0.0.1"
    base = {
        "PATH": f"{REPO / '.venv' / 'bin'}:/usr/bin:/bin",
        "HOME": str(cluster.work),
        "LANG": "C.UTF-8",
        **cluster.aws,
    }
    log = cluster.work / "logs" / f"{tag}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    return Proc(tag, argv, {**base, **env}, ports, log)


def _env_value(item: Obj, env: dict[str, str], cluster: Cluster, node: str) -> str | None:
    if "value" in item:
        value = expand(str(item["value"]), env)
        return cluster.services.get(value, value)
    source = item["valueFrom"]
    if "fieldRef" in source:
        assert source["fieldRef"]["fieldPath"] == "spec.nodeName", source
        return node
    ref = source["secretKeyRef"]
    if ref.get("optional") and (ref["name"], ref["key"]) not in cluster.secrets:
        return None  # as the kubelet leaves an optional Secret's variable out
    return cluster.secrets[(ref["name"], ref["key"])]


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            status: int = resp.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code


def probe_url(proc: Proc, probe: Obj) -> str:
    """The URL of an httpGet probe as declared: its path, its port (number or name)."""
    get = probe["httpGet"]
    return f"http://127.0.0.1:{proc.ports[str(get['port'])]}{get['path']}"


def wait_for(proc: Proc, url: str) -> None:
    """Until `url` answers 200, as a startupProbe waits (a hang guard, not a timing)."""
    deadline = time.monotonic() + WAIT
    while True:
        assert proc.alive(), f"{proc.name} exited:\n{proc.output()}"
        assert time.monotonic() < deadline, f"{url} never answered 200:\n{proc.output()}"
        with contextlib.suppress(OSError):
            if http_status(url) == 200:
                return
        time.sleep(0.2)


def stop_as_kubelet(proc: Proc, pod: Obj, container: Obj, racing: Callable[[], None]) -> int:
    """Stops `proc` as the kubelet stops `container` of `pod`: its preStop hook, then SIGTERM, then
    SIGKILL once the grace period is over; returns the exit status. `racing` is a request that
    reaches the pod while the Service is still dropping it (the endpoints' update and the stop
    begin together): during the hook if there is one, else once the SIGTERM took effect (the
    race's worst case). A sleep hook is not slept: its seconds stand for the cluster's propagation
    time, which has no local stand-in, so only the order is rehearsed."""
    assert proc.popen is not None
    hook = container.get("lifecycle", {}).get("preStop")
    seconds = 0
    if hook is not None:
        assert set(hook) == {"sleep"}, f"not rehearsed: preStop {hook}"
        seconds = hook["sleep"]["seconds"]
        racing()
    proc.popen.terminate()
    try:
        status = proc.popen.wait(timeout=pod.get("terminationGracePeriodSeconds", 30) - seconds)
    except subprocess.TimeoutExpired:
        proc.popen.kill()
        status = proc.popen.wait(timeout=WAIT)
    if hook is None:
        racing()
    return status


@contextlib.contextmanager
def running(procs: list[Proc]) -> Iterator[list[Proc]]:
    try:
        for proc in procs:
            proc.start()
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def pod_env(proc: Proc) -> dict[str, str]:
    """A process's environment without the stand-ins' base (for a client's own processes)."""
    return {k: v for k, v in proc.env.items() if k not in ("PATH", "HOME", "LANG")} | {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin")
    }


def copy_build(dst: Path) -> Path:
    """A checkout of the code as an image carries it: the packages, compiled once (the image's
    bytecode; with PYTHONDONTWRITEBYTECODE set, as in CI, every process would compile them
    again). `shutil.copytree` of it keeps the sources' times, so a copy's bytecode stays valid."""
    for package in BUILD_PACKAGES:
        shutil.copytree(
            REPO / package, dst / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    compileall.compile_dir(dst, quiet=1)
    return dst


def build_process(
    build: Path, env: dict[str, str], args: list[str], log: Path, ports: dict[str, int]
) -> Proc:
    """`tierpoint ARGS` from the code of `build` (this repository, or a `copy_build`) with the
    venv's dependencies: the build's packages come first on the import path."""
    path = os.pathsep.join([str(build), str(build / "client")])
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "apps.cli.main", *args]
    return Proc(log.stem, argv, {**env, "PYTHONPATH": path}, ports, log)


class Endpoints:
    """A Service's endpoints during a rolling update: requests go round-robin to the replicas in
    the rotation; a replica leaves the rotation before it is stopped, and its requests in flight
    finish first (the endpoints controller, given time by the API's preStop sleep, and the API's
    graceful shutdown)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._urls: list[str] = []
        self._next = 0
        self._in_flight: Counter[str] = Counter()

    def add(self, url: str) -> None:
        with self._cond:
            self._urls.append(url)

    def remove(self, url: str) -> None:
        """Out of the rotation, once its requests in flight have their answers."""
        with self._cond:
            self._urls.remove(url)
            drained = self._cond.wait_for(lambda: self._in_flight[url] == 0, timeout=WAIT)
        assert drained, f"{url}: requests still in flight after {WAIT:.0f} s"

    @contextlib.contextmanager
    def pick(self) -> Iterator[str]:
        with self._cond:
            assert self._urls, "no replica in the rotation"
            url = self._urls[self._next % len(self._urls)]
            self._next += 1
            self._in_flight[url] += 1
        try:
            yield url
        finally:
            with self._cond:
                self._in_flight[url] -= 1
                self._cond.notify_all()
