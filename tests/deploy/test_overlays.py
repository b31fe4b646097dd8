"""The assembled deployments beside the example overlay: the headline tiers (ssd -> peer ->
lustre -> s3, RAM -> peer -> s3), the API on HTTPS, PgBouncer, the Prometheus Operator objects,
the FSx storage objects and the Temporal Helm values. Each renders, its core objects are valid
against the Kubernetes schemas (strict), it keeps the deployment rules, and holds what
docs/deployment.md says of it; the alert rules pass `promtool check rules`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_kubernetes import TEST_URL, _kubectl_objects, _schema_errors
from tests.helpers.debian_tools import require
from tests.helpers.kustomize import Obj, example_overlay, normalize_hashes, pod_spec, render
from tests.helpers.manifest_rules import problems
from tierpoint.config import Settings
from tierpoint.tier_config import TierKind

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("overlays/peer", "overlays/ram", "overlays/api-tls")
# Custom resources (cert-manager, the Prometheus Operator): no schema in kubernetes-validate.
CUSTOM = {"Certificate", "PodMonitor", "PrometheusRule"}


def _tree(tmp: Path) -> Path:
    """deploy/kubernetes copied, with the files the operator creates (secrets/)."""
    overlay = example_overlay(tmp, TEST_URL)
    (overlay.parent / "peer" / "secrets").mkdir()
    (overlay.parent / "peer" / "secrets" / "data-token").write_text("data-token")
    return overlay.parents[1]


def _objects(tmp: Path, which: str) -> list[Obj]:
    return render(_tree(tmp) / which).objects


def _named(objects: list[Obj], kind: str, name: str) -> Obj:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def _settings(objects: list[Obj]) -> Settings:
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    return Settings.model_validate(tomllib.loads(config["data"]["tierpoint.toml"]))


def _worker(objects: list[Obj]) -> tuple[Obj, Obj]:
    spec = pod_spec(_named(objects, "DaemonSet", "tierpoint-node-worker"))
    assert spec is not None
    return spec, spec["containers"][0]


@pytest.mark.parametrize("which", [*OVERLAYS, "pgbouncer", "monitoring"])
def test_renders_valid_and_keeps_the_rules(which: str, tmp_path: Path) -> None:
    objects = _objects(tmp_path, which)
    assert _schema_errors([o for o in objects if o["kind"] not in CUSTOM]) == []
    if which in OVERLAYS:  # the others are pieces added to an overlay, not tierpoint's pods
        assert problems(objects) == []


@pytest.mark.full_stack  # runs kubectl
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
@pytest.mark.parametrize("which", [*OVERLAYS, "pgbouncer", "monitoring"])
def test_the_renderer_agrees_with_kubectl_kustomize(which: str, tmp_path: Path) -> None:
    directory = _tree(tmp_path) / which
    ours = render(directory)
    mine = sorted(
        normalize_hashes(json.dumps(o, sort_keys=True), ours.generated) for o in ours.objects
    )
    assert mine == _kubectl_objects(directory, ours.generated)


@pytest.mark.parametrize(
    ("which", "tiers", "local_root"),
    [
        ("overlays/peer", ["ssd", "peer", "lustre", "s3"], "/mnt/nvme/tierpoint"),
        ("overlays/ram", ["ram", "peer", "s3"], "/dev/shm/tierpoint"),
    ],
)
def test_the_headline_tiers_are_assembled(
    which: str, tiers: list[str], local_root: str, tmp_path: Path
) -> None:
    objects = _objects(tmp_path, which)
    settings = _settings(objects)
    assert [t.name for t in settings.tiers] == tiers
    spec, worker = _worker(objects)
    env = {e["name"]: e for e in worker["env"]}
    # The data endpoint on the pod's address, its port declared, the shared data token.
    assert env["TIERPOINT_DATA_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    port = int(env["TIERPOINT_DATA_PORT"]["value"])
    assert {"name": "data", "containerPort": port} in worker["ports"]
    token = env["TIERPOINT_DATA_TOKEN"]["valueFrom"]["secretKeyRef"]["name"]
    assert token.startswith("tierpoint-data-")  # the generated Secret, its hash suffix
    assert isinstance(settings.failure_domain, dict) and settings.failure_domain
    # Each node-resident root a hostPath that must exist (never made on the root volume).
    host = {
        v["hostPath"]["path"]: v["hostPath"]["type"] for v in spec["volumes"] if "hostPath" in v
    }
    mounts = {m["mountPath"] for m in worker["volumeMounts"]}
    for tier in settings.tiers:
        if tier.kind in (TierKind.LOCAL, TierKind.PEER):
            assert host.get(str(tier.root)) == "Directory" and tier.root in mounts
    assert settings.tiers[0].root == local_root
    # Node workers and training pods reach the data port; nothing else does.
    policy = _named(objects, "NetworkPolicy", "tierpoint-node-data")
    assert policy["spec"]["ingress"][0]["ports"] == [{"port": "data", "protocol": "TCP"}]
    sources = policy["spec"]["ingress"][0]["from"]
    assert {
        "app.kubernetes.io/component": "node-worker",
        "app.kubernetes.io/name": "tierpoint",
    } in [s.get("podSelector", {}).get("matchLabels") for s in sources]


def test_the_api_serves_https_only(tmp_path: Path) -> None:
    objects = _objects(tmp_path, "overlays/api-tls")
    service = _named(objects, "Service", "tierpoint-api")
    assert [p["port"] for p in service["spec"]["ports"]] == [443]
    spec = pod_spec(_named(objects, "Deployment", "tierpoint-api"))
    assert spec is not None
    api = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in api["env"]}
    mounts = {m["name"]: m["mountPath"] for m in api["volumeMounts"]}
    assert Path(env["TIERPOINT_API_TLS_CERT"]).parent == Path(mounts["api-tls"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert api[probe]["httpGet"]["scheme"] == "HTTPS"
    cert = _named(objects, "Certificate", "tierpoint-api")
    assert cert["spec"]["secretName"] == "tierpoint-api-tls"
    assert "tierpoint-api.tierpoint.svc.cluster.local" in cert["spec"]["dnsNames"]
    ingress = _named(objects, "Ingress", "tierpoint-api")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "tierpoint-api", "port": {"name": "https"}}


def test_the_training_pod_reaches_the_api_over_https_with_its_ca() -> None:
    pod = yaml.safe_load((KUBE / "training-pod.yaml").read_text())
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["TIERPOINT_API_URL"].startswith("https://")
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert Path(env["TIERPOINT_API_TLS_CA"]).parent == Path(mounts["tierpoint-api-ca"])


def test_one_namespace_name_everywhere(tmp_path: Path) -> None:
    """The Kubernetes namespace and the Temporal namespace are `tierpoint` in every overlay, as
    docs/deployment.md creates them."""
    for which in ("overlays/example", *OVERLAYS):
        objects = _objects(tmp_path / which.replace("/", "-"), which)
        assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {
            "tierpoint"
        }
        assert _settings(objects).temporal_namespace == "tierpoint"
    doc = (ROOT / "docs" / "deployment.md").read_text()
    assert "kubectl create namespace tierpoint" in doc
    assert "--namespace tierpoint" in doc


def test_storage_objects_are_valid() -> None:
    objects = list(yaml.safe_load_all((KUBE / "storage" / "fsx.yaml").read_text()))
    assert _schema_errors(objects) == []
    claim = yaml.safe_load((KUBE / "overlays" / "example" / "shared-pvc.yaml").read_text())
    storage_class = next(o for o in objects if o["kind"] == "StorageClass")
    assert claim["spec"]["storageClassName"] == storage_class["metadata"]["name"]
    volume = next(o for o in objects if o["kind"] == "PersistentVolume")
    assert volume["spec"]["claimRef"]["name"] == claim["metadata"]["name"]


@pytest.mark.full_stack  # runs promtool
def test_alert_rules_pass_promtool_and_the_prometheus_rule_holds_them(tmp_path: Path) -> None:
    promtool = require("promtool")["promtool"]
    alerts = ROOT / "docs" / "alerts.yml"
    checked = subprocess.run(
        [promtool, "check", "rules", str(alerts)], capture_output=True, text=True, timeout=120
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rule = yaml.safe_load((KUBE / "monitoring" / "prometheusrule.yaml").read_text())
    assert rule["spec"]["groups"] == yaml.safe_load(alerts.read_text())["groups"]
    # promtool on the PrometheusRule's own groups too: a broken rule there is refused.
    extracted = tmp_path / "rules.yml"
    extracted.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    ok = subprocess.run([promtool, "check", "rules", str(extracted)], capture_output=True)
    assert ok.returncode == 0
    broken = rule["spec"]["groups"]
    broken[0]["rules"][0]["expr"] = "sum(rate(tierpoint_worker_bytes_copied_total[5m]"
    extracted.write_text(yaml.safe_dump({"groups": broken}))
    bad = subprocess.run([promtool, "check", "rules", str(extracted)], capture_output=True)
    assert bad.returncode != 0


def test_temporal_values_are_sized_as_scale_md_says() -> None:
    values = yaml.safe_load((ROOT / "deploy" / "temporal" / "values.yaml").read_text())
    shards = values["server"]["config"]["numHistoryShards"]
    sizing = (ROOT / "docs" / "scale.md").read_text()
    row = next(line for line in sizing.splitlines() if line.startswith("| 1,000 |"))
    assert re.search(rf"\b{shards} history shards\b", row), row
    partitions = values["server"]["dynamicConfig"]["matching.numTaskqueueReadPartitions"]
    assert partitions[0] == {"value": 1, "constraints": {"namespace": "tierpoint"}}
