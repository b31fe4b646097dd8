"""deploy/kubernetes: the kustomize base and the example overlay render, every object is valid
against the Kubernetes schemas of KUBERNETES_VERSION (kubernetes-validate, strict: unknown fields
fail), and the manifests keep what docs/deployment.md promises (tests/deploy/manifest_rules.py).
Every check is also shown to fail on a deliberately broken copy."""

from __future__ import annotations

import ast
import copy
import json
import shutil
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.helpers.kustomize import (
    Obj,
    Rendered,
    UnsupportedKustomization,
    example_overlay,
    normalize_hashes,
    render,
)
from tests.helpers.manifest_rules import KUBERNETES_VERSION, problems, training_pod_problems
from tierpoint.config import Settings

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
TEST_URL = "postgresql+psycopg://tierpoint@db.test:5432/tierpoint"


@pytest.fixture(scope="module")
def base() -> Rendered:
    return render(KUSTOMIZE / "base")


@pytest.fixture(scope="module")
def overlay(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    tmp = tmp_path_factory.mktemp("kustomize")
    return render(example_overlay(tmp, TEST_URL))


def _schema_errors(objects: list[Obj]) -> list[str]:
    errors = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    return errors


def _by_kind(rendered: Rendered) -> dict[str, list[str]]:
    kinds: dict[str, list[str]] = {}
    for obj in rendered.objects:
        kinds.setdefault(obj["kind"], []).append(obj["metadata"]["name"])
    return kinds


def test_base_renders_every_workload(base: Rendered) -> None:
    kinds = _by_kind(base)
    assert kinds["Deployment"] == ["tierpoint-api", "tierpoint-worker"]
    assert kinds["DaemonSet"] == ["tierpoint-node-worker"]
    assert kinds["Job"] == ["tierpoint-migrate"]
    assert kinds["Service"] == ["tierpoint-api"]
    assert kinds["NetworkPolicy"] == [
        "tierpoint-api",
        "tierpoint-worker-metrics",
        "tierpoint-no-ingress",
    ]
    assert [n.rsplit("-", 1)[0] for n in kinds["ConfigMap"]] == ["tierpoint-config"]
    # Secrets are the operator's: none is committed in the base.
    assert "Secret" not in kinds


def test_base_objects_match_the_kubernetes_schemas(base: Rendered) -> None:
    assert _schema_errors(base.objects) == []


def test_overlay_objects_match_the_kubernetes_schemas(overlay: Rendered) -> None:
    assert _schema_errors(overlay.objects) == []
    kinds = _by_kind(overlay)
    assert set(kinds) >= {"Namespace", "PersistentVolumeClaim", "Secret"}


def test_base_keeps_the_deployment_rules(base: Rendered) -> None:
    assert problems(base.objects) == []


def test_overlay_keeps_the_deployment_rules(overlay: Rendered) -> None:
    assert problems(overlay.objects) == []
    images = {
        c["image"]
        for o in overlay.objects
        if o["kind"] in ("Deployment", "DaemonSet", "Job")
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"registry.example.com/tierpoint:0.1.0"}


def _kubectl_objects(directory: Path, generated: set[tuple[str, str]]) -> list[str]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    objects = list(yaml.safe_load_all(out))
    for obj in objects:
        if obj["kind"] == "Secret":
            # kustomize wraps long base64 values into lines; the bytes are the same.
            obj["data"] = {k: v.replace("\n", "") for k, v in obj["data"].items()}
    return sorted(normalize_hashes(json.dumps(o, sort_keys=True), generated) for o in objects)


@pytest.mark.full_stack  # runs kubectl
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
@pytest.mark.parametrize("which", ["base", "overlays/example"])
def test_the_renderer_agrees_with_kubectl_kustomize(which: str, tmp_path: Path) -> None:
    directory = example_overlay(tmp_path, TEST_URL).parents[1] / which
    ours = render(directory)
    mine = sorted(
        normalize_hashes(json.dumps(o, sort_keys=True), ours.generated) for o in ours.objects
    )
    assert mine == _kubectl_objects(directory, ours.generated)


def test_the_renderer_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    tree = example_overlay(tmp_path, TEST_URL).parents[1]
    kustomization = tree / "base" / "kustomization.yaml"
    kustomization.write_text(kustomization.read_text() + "commonLabels:\n  team: x\n")
    with pytest.raises(UnsupportedKustomization, match="commonLabels"):
        render(tree / "base")


def _deployment(objects: list[Obj]) -> Obj:
    return next(o for o in objects if o["metadata"]["name"] == "tierpoint-api")


def _api_container(obj: Obj) -> Obj:
    container: Obj = obj["spec"]["template"]["spec"]["containers"][0]
    return container


SCHEMA_BREAKS: dict[str, Callable[[Obj], None]] = {
    "replicas is a string": lambda d: d["spec"].__setitem__("replicas", "two"),
    "containerPort is a string": lambda d: _api_container(d)["ports"][0].__setitem__(
        "containerPort", "http"
    ),
    "unknown field (strict)": lambda d: d["spec"].__setitem__("replica", 2),
    "no containers": lambda d: d["spec"]["template"]["spec"].pop("containers"),
    "env value is a number": lambda d: _api_container(d)["env"][0].__setitem__("value", 1),
}


@pytest.mark.parametrize("name", SCHEMA_BREAKS)
def test_a_broken_deployment_fails_the_schema_check(name: str, base: Rendered) -> None:
    broken = copy.deepcopy(_deployment(base.objects))
    SCHEMA_BREAKS[name](broken)
    assert _schema_errors([broken]) != []


def _container_named(objects: list[Obj], name: str) -> Obj:
    for obj in objects:
        if obj["kind"] not in ("Deployment", "DaemonSet", "Job"):
            continue
        spec = obj["spec"]["template"]["spec"]
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            if f"{obj['metadata']['name']}/{container['name']}" == name:
                return container  # type: ignore[no-any-return]
    raise KeyError(name)


def _pod(objects: list[Obj], name: str) -> Obj:
    obj = next(o for o in objects if o["metadata"]["name"] == name)
    spec: Obj = obj["spec"]["template"]["spec"]
    return spec


RULE_BREAKS: dict[str, tuple[Callable[[list[Obj]], None], str]] = {
    "readiness path the API does not serve": (
        lambda objs: _container_named(objs, "tierpoint-api/api")["startupProbe"]["httpGet"].update(
            path="/ready"
        ),
        "/ready",
    ),
    "metrics annotation on another port": (
        lambda objs: _deployment(objs)["spec"]["template"]["metadata"]["annotations"].update(
            {"prometheus.io/port": "9090"}
        ),
        "prometheus.io/port",
    ),
    "worker metrics annotation on another port": (
        lambda objs: next(o for o in objs if o["metadata"]["name"] == "tierpoint-node-worker")[
            "spec"
        ]["template"]["metadata"]["annotations"].update({"prometheus.io/port": "9090"}),
        "tierpoint-node-worker: prometheus.io/port",
    ),
    "worker metrics on loopback": (
        lambda objs: _container_named(objs, "tierpoint-worker/worker")["args"].__setitem__(
            2, "127.0.0.1"
        ),
        "cannot be scraped",
    ),
    "worker metrics port not admitted": (
        lambda objs: next(o for o in objs if o["metadata"]["name"] == "tierpoint-worker-metrics")[
            "spec"
        ]["ingress"][0]["ports"][0].update(port="http"),
        "no NetworkPolicy admits the scraped port 9464",
    ),
    "no resource requests": (
        lambda objs: _container_named(objs, "tierpoint-worker/worker").pop("resources"),
        "requests",
    ),
    "root pod": (
        lambda objs: _pod(objs, "tierpoint-worker")["securityContext"].update(runAsNonRoot=False),
        "runAsNonRoot",
    ),
    "AWS key in a manifest": (
        lambda objs: _container_named(objs, "tierpoint-worker/worker")["env"].append(
            {"name": "AWS_SECRET_ACCESS_KEY", "value": "x"}
        ),
        "AWS_SECRET_ACCESS_KEY",
    ),
    "node id not the node name": (
        lambda objs: _container_named(objs, "tierpoint-node-worker/worker")["env"][0].update(
            valueFrom={"fieldRef": {"fieldPath": "metadata.name"}}
        ),
        "spec.nodeName",
    ),
    "local root not the hostPath": (
        lambda objs: next(
            v for v in _pod(objs, "tierpoint-node-worker")["volumes"] if v["name"] == "local"
        )["hostPath"].update(path="/mnt/other"),
        "hostPath",
    ),
    "local root created on the root volume": (
        lambda objs: next(
            v for v in _pod(objs, "tierpoint-node-worker")["volumes"] if v["name"] == "local"
        )["hostPath"].update(type="DirectoryOrCreate"),
        "not Directory",
    ),
    "shared tier not mounted": (
        lambda objs: _container_named(objs, "tierpoint-worker/worker")["volumeMounts"].remove(
            {"name": "shared", "mountPath": "/fsx/tierpoint"}
        ),
        "/fsx/tierpoint",
    ),
    "settings file not mounted": (
        lambda objs: _container_named(objs, "tierpoint-migrate/migrate")["volumeMounts"].pop(0),
        "not mounted at /etc/tierpoint",
    ),
    "API stopped while the Service still sends it requests": (
        lambda objs: _container_named(objs, "tierpoint-api/api").pop("lifecycle"),
        "no preStop sleep",
    ),
    "API's preStop sleep takes the whole grace period": (
        lambda objs: _pod(objs, "tierpoint-api").update(terminationGracePeriodSeconds=5),
        "leaves none of the 5 s grace period",
    ),
    "API starts before the schema is checked": (
        lambda objs: _pod(objs, "tierpoint-api").pop("initContainers"),
        "migrate --check",
    ),
}


@pytest.mark.parametrize("name", RULE_BREAKS)
def test_a_broken_manifest_fails_the_deployment_rules(name: str, base: Rendered) -> None:
    objects = copy.deepcopy(base.objects)
    breaks, expected = RULE_BREAKS[name]
    breaks(objects)
    found = problems(objects)
    assert any(expected in p for p in found), found


TRAINING_POD = KUSTOMIZE / "training-pod.yaml"


def test_the_training_pod_template_matches_the_schema_and_the_overlay(overlay: Rendered) -> None:
    pod = yaml.safe_load(TRAINING_POD.read_text())
    assert _schema_errors([pod]) == []
    config = next(o for o in overlay.objects if o["kind"] == "ConfigMap")
    settings = Settings(**tomllib.loads(config["data"]["tierpoint.toml"]))
    namespace = next(o for o in overlay.objects if o["kind"] == "Namespace")["metadata"]["name"]
    service = f"https://tierpoint-api.{namespace}.svc.cluster.local"
    assert training_pod_problems(pod, settings, service) == []


def _client_node_variable() -> str:
    """NODE_ENV of the client's DCP storage, read from its source (torch is not in this venv)."""
    source = (ROOT / "client" / "tierpoint_client" / "torch" / "_files.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "NODE_ENV":
            value = ast.literal_eval(node.value)
            assert isinstance(value, str)
            return value
    raise AssertionError("NODE_ENV not found in the client")


def test_the_node_id_has_one_name_for_worker_client_and_manifests(base: Rendered) -> None:
    prefix = Settings.model_config.get("env_prefix", "")
    assert f"{prefix}NODE".upper() == _client_node_variable() == "TIERPOINT_NODE"
    assert "node" in Settings.model_fields
    node_worker = next(o for o in base.objects if o["metadata"]["name"] == "tierpoint-node-worker")
    containers = node_worker["spec"]["template"]["spec"]["containers"]
    env = [e["name"] for c in containers for e in c["env"]]
    assert "TIERPOINT_NODE" in env and not {"NODE_NAME", "TIERPOINT_NODE_ID"} & set(env)
