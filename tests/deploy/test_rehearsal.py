"""A deploy rehearsal: the example overlay that docs/deployment.md starts from, rendered, and every
container of it run as a local process with the command, arguments and environment the manifests
give it (tests/helpers/rehearsal.py maps what only a cluster has), against real Postgres,
Temporal and S3: the migrations Job on an empty catalog, each pod's init containers, two API
replicas, the node worker DaemonSet on two simulated nodes and two shared workers, every probe
called as declared; then the training-pod template's environment saves and loads a DCP
checkpoint through the running deployment, and an API replica is stopped as the kubelet stops
it (its preStop hook, then SIGTERM) with a request racing the Service's update."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from tests.client.torch.ranks import RANK_SCRIPT, TORCH_PYTHON, require_torch_venv
from tests.helpers.kustomize import Obj, example_overlay, pod_spec, render
from tests.helpers.rehearsal import (
    Cluster,
    Proc,
    container_process,
    http_status,
    local_config,
    pod_env,
    probe_url,
    running,
    stop_as_kubelet,
    wait_for,
)
from tests.helpers.services import Services, fresh_database, make_bucket

ROOT = Path(__file__).resolve().parents[2]
TRAINING_POD = ROOT / "deploy" / "kubernetes" / "training-pod.yaml"
NODES = ("node-a", "node-b")
# The replicas of the Deployments as rendered (two each), one node worker per simulated node.
API, WORKER, NODE_WORKER, MIGRATE = (
    "tierpoint-api",
    "tierpoint-worker",
    "tierpoint-node-worker",
    "tierpoint-migrate",
)
# The template's URL (the api-tls overlay's HTTPS Service): the rehearsal maps it to its API.
CLUSTER_API_URL = "https://tierpoint-api.tierpoint.svc.cluster.local"
WAIT = 300.0  # hang guard only


def _workload(objects: list[Obj], name: str) -> Obj:
    return next(o for o in objects if o["metadata"]["name"] == name and pod_spec(o))


def _secrets(objects: list[Obj]) -> dict[tuple[str, str], str]:
    return {
        (o["metadata"]["name"], k): base64.b64decode(v).decode()
        for o in objects
        if o["kind"] == "Secret"
        for k, v in o.get("data", {}).items()
    }


def _run_init_containers(pod: Obj, cluster: Cluster, config: Path, node: str, tag: str) -> None:
    for init in pod.get("initContainers", []):
        if init["name"] == "prepare-local-root":
            # Hands the hostPath to uid 10001 as root; the local processes run as one user.
            continue
        proc = container_process(pod, init, cluster, config, node, f"{tag}-{init['name']}")
        assert proc.run() == 0, proc.output()


def _pods(objects: list[Obj], cluster: Cluster, config: Path) -> list[tuple[Obj, Proc]]:
    """(container, process) of every replica, after its init containers ran."""
    pods: list[tuple[Obj, Proc]] = []
    for name, replicas in ((API, ("0", "1")), (WORKER, ("0", "1")), (NODE_WORKER, NODES)):
        obj = _workload(objects, name)
        spec = pod_spec(obj)
        assert spec is not None
        if obj["kind"] == "Deployment":
            assert obj["spec"]["replicas"] == len(replicas)
        main = spec["containers"][0]
        for replica in replicas:
            node = replica if replica in NODES else NODES[0]
            tag = f"{name}-{replica}"
            _run_init_containers(spec, cluster, config, node, tag)
            pods.append((main, container_process(spec, main, cluster, config, node, tag)))
    return pods


def _check_probes(pods: list[tuple[Obj, Proc]]) -> int:
    """Every probe as declared; every scrape annotation's port answers /metrics."""
    called = 0
    for main, proc in pods:
        if "startupProbe" in main:
            wait_for(proc, probe_url(proc, main["startupProbe"]))
            called += 1
        for kind in ("readinessProbe", "livenessProbe"):
            if kind in main:
                assert http_status(probe_url(proc, main[kind])) == 200, (proc.name, kind)
                called += 1
    return called


def _stop_an_api_replica(objects: list[Obj], pods: list[tuple[Obj, Proc]]) -> None:
    """One API replica stopped as the kubelet stops it (a rollout, a drained node): a request
    that races the Service's update is answered, and the API ends on its SIGTERM."""
    spec = pod_spec(_workload(objects, API))
    assert spec is not None
    main, proc = next((c, p) for c, p in pods if p.name == f"{API}-1")
    answers: list[object] = []

    def racing() -> None:
        try:
            answers.append(http_status(probe_url(proc, main["readinessProbe"])))
        except OSError as exc:
            answers.append(exc)

    status = stop_as_kubelet(proc, spec, main, racing)
    assert answers == [200]
    # uvicorn re-raises the SIGTERM once it has shut down.
    assert status in (0, -signal.SIGTERM), proc.output()


@pytest.fixture
def cluster(services: Services, temporal_namespace: str, tmp_path: Path) -> Cluster:
    return Cluster(
        work=tmp_path / "cluster",
        temporal_address=services.temporal_address,
        temporal_namespace=temporal_namespace,
        s3_endpoint_url=services.s3_endpoint_url,
        s3_bucket=make_bucket(services),
        aws={
            "AWS_ACCESS_KEY_ID": services.s3_access_key_id,
            "AWS_SECRET_ACCESS_KEY": services.s3_secret_access_key,
            "AWS_DEFAULT_REGION": services.s3_region,
        },
        secrets={},
    )


def _training(cluster: Cluster, config: Path, admin_env: dict[str, str], api_url: str) -> Proc:
    """The training-pod template's container on node-a, its token made as docs/deployment.md
    says (a train: token of the job's prefix, from the catalog)."""
    made = subprocess.run(
        ["tierpoint", "token", "create", "train-rehearsal", "--scope", "train:rehearsal-"],
        env=admin_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    cluster.secrets[("tierpoint-train-token", "token")] = made.stdout.strip()
    cluster.services[CLUSTER_API_URL] = api_url
    pod = yaml.safe_load(TRAINING_POD.read_text())["spec"]
    return container_process(pod, pod["containers"][0], cluster, config, NODES[0], "trainer")


def _dcp(trainer: Proc, tmp: Path, action: str, job: str) -> dict[str, object]:
    out = tmp / f"{action}.json"
    env = pod_env(trainer) | {"OMP_NUM_THREADS": "1"}
    cmd = [str(TORCH_PYTHON), str(RANK_SCRIPT), action, "--job", job, "--out", str(out)]
    cmd += ["--init-file", str(tmp / f"{action}-pg")]
    if action == "save":
        cmd += ["--step", "7"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=WAIT)
    assert done.returncode == 0, done.stdout + done.stderr
    report: dict[str, object] = json.loads(out.read_text())
    return report


async def test_the_overlay_runs_as_rendered(
    services: Services, cluster: Cluster, tmp_path: Path
) -> None:
    # The operator's one file: the catalog URL (an empty database: the Job migrates it).
    tree = example_overlay(tmp_path / "kustomize", fresh_database(services.database_url))
    objects = render(tree).objects
    cluster.secrets.update(_secrets(objects))
    worker = pod_spec(_workload(objects, WORKER))
    assert worker is not None
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in worker["volumes"]
        if "persistentVolumeClaim" in v
    }
    pvc_mounts = {
        m["mountPath"]: claims[m["name"]]
        for m in worker["containers"][0]["volumeMounts"]
        if m["name"] in claims
    }
    config = local_config(objects, cluster, pvc_mounts)
    for node in NODES:
        # The kubelet makes a missing hostPath (DirectoryOrCreate).
        cluster.host_dir(node, "/mnt/nvme/tierpoint").mkdir(parents=True)
    for claim in pvc_mounts.values():
        cluster.claim_dir(claim).mkdir(parents=True)

    job = pod_spec(_workload(objects, MIGRATE))
    assert job is not None
    migrate = container_process(job, job["containers"][0], cluster, config, NODES[0], MIGRATE)
    assert migrate.run() == 0, migrate.output()

    pods = await asyncio.to_thread(_pods, objects, cluster, config)
    with running([proc for _, proc in pods]):
        called = await asyncio.to_thread(_check_probes, pods)
        assert called == 6  # startup, readiness and liveness of each API replica
        for _, proc in pods:
            if "metrics" in proc.ports:
                assert http_status(f"http://127.0.0.1:{proc.ports['metrics']}/metrics") == 200

        require_torch_venv()
        api = next(proc for _, proc in pods if proc.name == f"{API}-0")
        trainer = _training(cluster, config, migrate.env, f"http://127.0.0.1:{api.ports['http']}")
        name = f"rehearsal-{uuid.uuid4().hex[:8]}"
        saved = await asyncio.to_thread(_dcp, trainer, tmp_path, "save", name)
        assert saved["registered"] is True, saved
        loaded = await asyncio.to_thread(_dcp, trainer, tmp_path, "load", name)
        assert loaded["step"] == 7 and loaded["mismatches"] == [], loaded
        assert all(proc.alive() for _, proc in pods), [p.output() for _, p in pods if not p.alive()]
        await asyncio.to_thread(_stop_an_api_replica, objects, pods)
    shutil.rmtree(cluster.work / "hosts", ignore_errors=True)
