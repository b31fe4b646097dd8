"""What the Kubernetes manifests must keep beyond schema validity, as one function returning every
problem found: the promises of docs/deployment.md, checked against the code they depend on (the
health router's paths, the settings model, the tier roots of the configured TOML)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator

from fastapi.routing import APIRoute

from api.routers.health import router as health_router
from tests.helpers.kustomize import Obj, pod_spec
from tierpoint.config import Settings
from tierpoint.tier_config import TierKind

# The oldest Kubernetes minor the manifests are meant for (EKS and GKE both still offer it).
KUBERNETES_VERSION = "1.32.0"
API_PATHS = {r.path for r in health_router.routes if isinstance(r, APIRoute)}
CREDENTIAL_VARS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}
# The one container that runs as root: it hands the node's hostPath to the worker's user.
ROOT_INIT = "tierpoint-node-worker/prepare-local-root"
CONFIG_MOUNT = "/etc/tierpoint"


def _workloads(objects: list[Obj]) -> Iterator[tuple[str, Obj, Obj]]:
    for obj in objects:
        spec = pod_spec(obj)
        if spec is not None:
            yield obj["metadata"]["name"], obj, spec


def _containers(spec: Obj) -> list[Obj]:
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def _settings(objects: list[Obj]) -> tuple[Settings | None, list[str]]:
    config = [o for o in objects if o["kind"] == "ConfigMap" and "tierpoint.toml" in o["data"]]
    if len(config) != 1:
        return None, [f"expected one ConfigMap with tierpoint.toml, found {len(config)}"]
    try:
        return Settings(**tomllib.loads(config[0]["data"]["tierpoint.toml"])), []
    except Exception as exc:
        return None, [f"tierpoint.toml is not valid Settings: {exc}"]


def _container_rules(name: str, container: Obj, pod: Obj) -> Iterator[str]:
    where = f"{name}/{container['name']}"
    resources = container.get("resources", {})
    if not {"cpu", "memory"} <= set(resources.get("requests", {})):
        yield f"{where}: cpu and memory requests"
    if "memory" not in resources.get("limits", {}):
        yield f"{where}: a memory limit"
    sc = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    if sc.get("allowPrivilegeEscalation") is not False:
        yield f"{where}: allowPrivilegeEscalation must be false"
    if "ALL" not in sc.get("capabilities", {}).get("drop", []):
        yield f"{where}: capabilities must drop ALL"
    if where == ROOT_INIT:
        if sc.get("capabilities", {}).get("add") != ["CHOWN"]:
            yield f"{where}: root only with CHOWN"
    elif sc.get("runAsNonRoot") is not True or sc.get("runAsUser", 0) == 0:
        yield f"{where}: runAsNonRoot with a non-zero runAsUser"
    for env in container.get("env", []):
        if env["name"] in CREDENTIAL_VARS:
            yield f"{where}: {env['name']} in a manifest (use the AWS chain: IRSA)"
        if env["name"] == "TIERPOINT_CONFIG_FILE":
            if not env["value"].startswith(CONFIG_MOUNT + "/"):
                yield f"{where}: TIERPOINT_CONFIG_FILE outside {CONFIG_MOUNT}"
            if CONFIG_MOUNT not in _mounts(container):
                yield f"{where}: the ConfigMap is not mounted at {CONFIG_MOUNT}"
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        path = container.get(kind, {}).get("httpGet", {}).get("path")
        if path is not None and path not in API_PATHS:
            yield f"{where}: {kind} path {path} is not served (health router: {sorted(API_PATHS)})"


def _mounts(container: Obj) -> set[str]:
    return {m["mountPath"] for m in container.get("volumeMounts", [])}


def _main(spec: Obj) -> Obj:
    container: Obj = spec["containers"][0]
    return container


def _specific_rules(name: str, obj: Obj, spec: Obj, settings: Settings) -> Iterator[str]:
    main = _main(spec)
    shared = [t.root for t in settings.tiers if t.kind is TierKind.SHARED]
    local = [t.root for t in settings.tiers if t.kind is TierKind.LOCAL]
    waits = any("migrate --check" in " ".join(c.get("command", [])) for c in _containers(spec))
    if name != "tierpoint-migrate" and not waits:
        yield f"{name}: no init container waits for `tierpoint migrate --check`"
    if name == "tierpoint-migrate" and main["args"] != ["migrate"]:
        yield f"{name}: runs {main['args']}, not migrate"
    if name == "tierpoint-api":
        if main.get("startupProbe", {}).get("httpGet", {}).get("path") != "/readyz":
            yield f"{name}: startupProbe on /readyz"
        if main.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
            yield f"{name}: livenessProbe on /healthz"
        yield from _pre_stop_rules(name, spec, main)
    if name in ("tierpoint-api", "tierpoint-worker", "tierpoint-node-worker"):
        # Every process serves its metrics on a listener of its own, never on the API's port.
        yield from _metrics_rules(name, obj, main)
    if name in ("tierpoint-worker", "tierpoint-node-worker"):
        for root in shared:
            if root not in _mounts(main):
                yield f"{name}: the shared tier {root} is not mounted"
    if name == "tierpoint-node-worker":
        if main["args"][:4] != ["worker", "--node", "$(TIERPOINT_NODE)", "--no-shared"]:
            yield f"{name}: args {main['args']}"
        yield from node_from_downward_api(name, main)
        host_paths = {
            v["hostPath"]["path"]: v["hostPath"].get("type", "")
            for v in spec.get("volumes", [])
            if "hostPath" in v
        }
        for root in local:
            if root not in host_paths or root not in _mounts(main):
                yield f"{name}: the local tier {root} must be a hostPath mounted at that path"
            elif host_paths[root] != "Directory":
                yield (
                    f"{name}: the local tier's hostPath {root} is {host_paths[root] or 'untyped'}, "
                    "not Directory: on a node without its NVMe mounted it would land on the root "
                    "volume"
                )


def _pre_stop_rules(name: str, spec: Obj, main: Obj) -> Iterator[str]:
    """The kubelet sends SIGTERM while the Service is still dropping the pod: a preStop sleep
    keeps the API serving until then, and leaves part of the grace period for its shutdown."""
    seconds = main.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds")
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if not isinstance(seconds, int) or seconds <= 0:
        yield f"{name}: no preStop sleep: requests that race the Service's update are refused"
    elif seconds >= grace:
        yield f"{name}: a preStop sleep of {seconds} s leaves none of the {grace} s grace period"


def training_pod_problems(pod: Obj, settings: Settings, api_service: str) -> list[str]:
    """deploy/kubernetes/training-pod.yaml: the node id, the API and the token as the client reads
    them, and the tiers' roots where the node worker has them."""
    main = _main(pod["spec"])
    found = list(node_from_downward_api("training-pod", main))
    env = {e["name"]: e for e in main.get("env", [])}
    if env.get("TIERPOINT_API_URL", {}).get("value") != api_service:
        found.append(f"training-pod: TIERPOINT_API_URL is not {api_service}")
    if "secretKeyRef" not in env.get("TIERPOINT_TOKEN", {}).get("valueFrom", {}):
        found.append("training-pod: TIERPOINT_TOKEN must come from a Secret")
    host_paths = {v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v}
    for tier in settings.tiers:
        if tier.kind is TierKind.LOCAL and tier.root not in host_paths:
            found.append(f"training-pod: the local tier {tier.root} is not a hostPath")
        if tier.kind in (TierKind.LOCAL, TierKind.SHARED) and tier.root not in _mounts(main):
            found.append(f"training-pod: the {tier.kind.value} tier {tier.root} is not mounted")
    return found


def node_from_downward_api(name: str, container: Obj) -> Iterator[str]:
    """TIERPOINT_NODE, the node id of the worker and of the client alike, is the node's name."""
    env: Obj = next((e for e in container.get("env", []) if e["name"] == "TIERPOINT_NODE"), {})
    if env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "spec.nodeName":
        yield f"{name}: TIERPOINT_NODE must come from spec.nodeName"


def _metrics_rules(name: str, obj: Obj, main: Obj) -> Iterator[str]:
    yield from _scrape_rules(name, obj, main, {"/metrics"})
    args = main["args"]
    port = args[args.index("--metrics-port") + 1] if "--metrics-port" in args else None
    host = args[args.index("--metrics-host") + 1] if "--metrics-host" in args else None
    annotated = obj["spec"]["template"]["metadata"].get("annotations", {})
    if port is None or annotated.get("prometheus.io/port") != port:
        yield f"{name}: prometheus.io/port is not the process's --metrics-port ({port})"
    if host in (None, "127.0.0.1", "localhost"):
        yield f"{name}: --metrics-host {host} cannot be scraped from outside the pod"


def _scrape_rules(name: str, obj: Obj, main: Obj, paths: set[str]) -> Iterator[str]:
    annotations = obj["spec"]["template"]["metadata"].get("annotations", {})
    ports = {str(p["containerPort"]) for p in main.get("ports", [])}
    if annotations.get("prometheus.io/scrape") != "true":
        yield f"{name}: prometheus.io/scrape"
    if annotations.get("prometheus.io/port") not in ports:
        yield f"{name}: prometheus.io/port is not a container port ({sorted(ports)})"
    if annotations.get("prometheus.io/path") not in paths:
        yield f"{name}: prometheus.io/path is not served"


def _selects(policy: Obj, labels: dict[str, str]) -> bool:
    selector = policy["spec"]["podSelector"]
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        if e["operator"] != "In" or labels.get(e["key"]) not in e["values"]:
            return False
    return True


def _ingress_rules(objects: list[Obj]) -> Iterator[str]:
    """Every port Prometheus is told to scrape is one a NetworkPolicy admits."""
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    for name, obj, spec in _workloads(objects):
        annotations = obj["spec"]["template"]["metadata"].get("annotations", {})
        port = annotations.get("prometheus.io/port")
        if port is None:
            continue
        labels = obj["spec"]["template"]["metadata"].get("labels", {})
        named = {str(p["containerPort"]): p.get("name") for p in _main(spec).get("ports", [])}
        admitted = {
            str(p["port"])
            for policy in policies
            if _selects(policy, labels)
            for rule in policy["spec"].get("ingress", [])
            for p in rule.get("ports", [])
        }
        if not ({port, named.get(port)} & admitted):
            yield f"{name}: no NetworkPolicy admits the scraped port {port}"


def problems(objects: list[Obj]) -> list[str]:
    settings, found = _settings(objects)
    for obj in objects:
        if obj["kind"] == "ConfigMap":
            found += [
                f"ConfigMap {obj['metadata']['name']}: {var}"
                for var in CREDENTIAL_VARS
                if any(var in v for v in obj["data"].values())
            ]
    names = set()
    for name, obj, spec in _workloads(objects):
        names.add(name)
        for container in _containers(spec):
            found += _container_rules(name, container, spec)
        if settings is not None:
            found += _specific_rules(name, obj, spec, settings)
    found += _ingress_rules(objects)
    expected = {"tierpoint-api", "tierpoint-worker", "tierpoint-node-worker", "tierpoint-migrate"}
    found += [f"missing workload {n}" for n in sorted(expected - names)]
    return found
