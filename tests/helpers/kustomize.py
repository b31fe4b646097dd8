"""A renderer for the subset of kustomize that deploy/kubernetes uses, so that the manifests are
validated on machines without kubectl. What it does not implement it refuses (an unknown
kustomization field, a patch with a list) rather than render differently from kustomize;
tests/deploy/test_kubernetes.py compares it with `kubectl kustomize` where kubectl exists.

Supported: `resources` (files and directories), `namespace`, `images`, `configMapGenerator` and
`secretGenerator` (`files`, `literals`; behavior create/replace/merge), `generatorOptions`
(`disableNameSuffixHash`), `patches` by `path` (strategic merge: mappings, the pod lists of
MERGE_KEYS item by item, lists of plain values replaced). Generated
names get a content hash suffix (not kustomize's hash: compare with `normalize_hashes`) and
every reference to them in pod specs is rewritten.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

KNOWN_FIELDS = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "images",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
    "patches",
}
CLUSTER_SCOPED = {
    "Namespace",
    "PersistentVolume",
    "StorageClass",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PriorityClass",
}
POD_SPEC_PATHS = {
    "Deployment": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}


class UnsupportedKustomization(ValueError):
    pass


@dataclass
class Rendered:
    objects: list[Obj]
    # (kind, name before the hash suffix) of every generated ConfigMap and Secret.
    generated: set[tuple[str, str]] = field(default_factory=set)


def _load_documents(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _key(obj: Obj) -> tuple[str, str]:
    return str(obj["kind"]), str(obj["metadata"]["name"])


def _generated(kind: str, spec: Obj, root: Path, hashed: bool) -> Obj:
    data: dict[str, str] = {}
    for entry in spec.get("files", []):
        key, _, rel = str(entry).rpartition("=")
        path = root / rel
        data[key or path.name] = path.read_text()
    for entry in spec.get("literals", []):
        key, _, value = str(entry).partition("=")
        data[key] = value
    unknown = set(spec) - {"name", "files", "literals", "behavior"}
    if unknown:
        raise UnsupportedKustomization(f"{kind} generator fields {sorted(unknown)}")
    obj: Obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": spec["name"]}}
    if kind == "Secret":
        obj["type"] = "Opaque"
        obj["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    else:
        obj["data"] = data
    obj["metadata"]["annotations"] = {"tierpoint.test/hash": str(hashed)}
    return obj


# The merge keys of the lists a strategic merge patch merges item by item (Kubernetes' own,
# for the fields the overlays patch); every other list is replaced, as kustomize does with
# `args`, `command` and lists without a merge key.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",  # a Service's: "port" (`_merge_key`)
}


def _merge_key(field: str, items: list[Any]) -> str:
    key = MERGE_KEYS[field]
    if field == "ports" and all(isinstance(i, dict) and "containerPort" not in i for i in items):
        return "port"
    return key


def _merge_list(target: list[Any], patch: list[Any], key: str, where: str) -> None:
    """Item by item on `key`; as kustomize orders the result: the patch's items first (merged
    into the target's of the same key), then the target's others. An item `$patch: delete`
    removes the target's item of its key."""
    merged: list[Any] = []
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise UnsupportedKustomization(f"patch {where}: an item without its {key}")
        if item.get("$patch") == "delete":
            target[:] = [t for t in target if not (isinstance(t, dict) and t.get(key) == item[key])]
            continue
        same = next((t for t in target if isinstance(t, dict) and t.get(key) == item[key]), None)
        if same is None:
            merged.append(copy.deepcopy(item))
        else:
            _merge_patch(same, item, where)
            merged.append(same)
    target[:] = merged + [t for t in target if not any(t is m for m in merged)]


def _merge_patch(target: Obj, patch: Obj, where: str) -> None:
    for k, v in patch.items():
        if isinstance(v, list) and k in MERGE_KEYS and isinstance(target.get(k), list):
            _merge_list(target[k], v, _merge_key(k, target[k] + v), where)
        elif isinstance(v, list) and any(isinstance(i, dict) for i in v) and k not in MERGE_KEYS:
            raise UnsupportedKustomization(f"patch {where}: lists are not merged here ({k})")
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge_patch(target[k], v, where)
        else:
            target[k] = copy.deepcopy(v)


def _containers(pod_spec: Obj) -> Iterator[Obj]:
    yield from pod_spec.get("initContainers", [])
    yield from pod_spec.get("containers", [])


def pod_spec(obj: Obj) -> Obj | None:
    path = POD_SPEC_PATHS.get(str(obj["kind"]))
    if path is None:
        return None
    node: Obj = obj
    for part in path:
        node = node[part]
    return node


def _set_image(pod: Obj, images: list[Obj]) -> None:
    for container in _containers(pod):
        name = re.split(r"[@:]", str(container["image"]), maxsplit=1)[0]
        for image in images:
            if image["name"] != name:
                continue
            new = str(image.get("newName", name))
            if "digest" in image:
                new += "@" + str(image["digest"])
            elif "newTag" in image:
                new += ":" + str(image["newTag"])
            container["image"] = new


def _rename_references(pod: Obj, names: dict[tuple[str, str], str]) -> None:
    def rename(ref: Obj | None, kind: str, key: str = "name") -> None:
        if ref is not None and (kind, ref.get(key)) in names:
            ref[key] = names[(kind, ref[key])]

    for volume in pod.get("volumes", []):
        rename(volume.get("configMap"), "ConfigMap")
        rename(volume.get("secret"), "Secret", "secretName")
        for source in volume.get("projected", {}).get("sources", []):
            rename(source.get("configMap"), "ConfigMap")
            rename(source.get("secret"), "Secret")
    for secret in pod.get("imagePullSecrets", []):
        rename(secret, "Secret")
    for container in _containers(pod):
        for env in container.get("env", []):
            value_from = env.get("valueFrom", {})
            rename(value_from.get("configMapKeyRef"), "ConfigMap")
            rename(value_from.get("secretKeyRef"), "Secret")
        for env_from in container.get("envFrom", []):
            rename(env_from.get("configMapRef"), "ConfigMap")
            rename(env_from.get("secretRef"), "Secret")


def _accumulate(directory: Path) -> Rendered:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - KNOWN_FIELDS
    if unknown:
        raise UnsupportedKustomization(f"{directory}: fields {sorted(unknown)}")
    objects: list[Obj] = []
    generated: set[tuple[str, str]] = set()
    for entry in kustomization.get("resources", []):
        path = directory / entry
        if path.is_dir():
            base = _accumulate(path)
            objects += base.objects
            generated |= base.generated
        else:
            objects += _load_documents(path)
    hashed = not kustomization.get("generatorOptions", {}).get("disableNameSuffixHash", False)
    for kind, key in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for spec in kustomization.get(key, []):
            new = _generated(kind, spec, directory, hashed)
            behavior = spec.get("behavior", "create")
            existing = next((o for o in objects if _key(o) == (kind, spec["name"])), None)
            if behavior == "create":
                if existing is not None:
                    raise UnsupportedKustomization(f"{kind} {spec['name']} exists already")
                objects.append(new)
            elif existing is None:
                raise UnsupportedKustomization(f"{behavior}: no {kind} {spec['name']} to change")
            elif behavior == "replace":
                existing["data"] = new["data"]
            elif behavior == "merge":
                existing["data"].update(new["data"])
            else:
                raise UnsupportedKustomization(f"generator behavior {behavior!r}")
            generated.add((kind, spec["name"]))
    for patch in kustomization.get("patches", []):
        if set(patch) != {"path"}:
            raise UnsupportedKustomization(f"patch fields {sorted(patch)}")
        for doc in _load_documents(directory / patch["path"]):
            target = next((o for o in objects if _key(o) == _key(doc)), None)
            if target is None:
                raise UnsupportedKustomization(f"patch {patch['path']}: no target {_key(doc)}")
            _merge_patch(target, doc, patch["path"])
    for obj in objects:
        pod = pod_spec(obj)
        if pod is not None:
            _set_image(pod, kustomization.get("images", []))
        if "namespace" in kustomization and obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = kustomization["namespace"]
    return Rendered(objects, generated)


def _content_hash(obj: Obj) -> str:
    digest = hashlib.sha256(json.dumps(obj.get("data"), sort_keys=True).encode()).hexdigest()
    return digest[:10]


def render(directory: Path) -> Rendered:
    """The objects `kubectl kustomize DIRECTORY` would print (in no particular order)."""
    rendered = _accumulate(directory)
    names: dict[tuple[str, str], str] = {}
    for obj in rendered.objects:
        annotations = obj["metadata"].get("annotations", {})
        hashed = annotations.pop("tierpoint.test/hash", None)
        if not annotations:
            obj["metadata"].pop("annotations", None)
        if hashed == "True":
            kind, name = _key(obj)
            obj["metadata"]["name"] = names[(kind, name)] = f"{name}-{_content_hash(obj)}"
    for obj in rendered.objects:
        pod = pod_spec(obj)
        if pod is not None:
            _rename_references(pod, names)
    return rendered


def normalize_hashes(text: str, generated: set[tuple[str, str]]) -> str:
    """`text` with the hash suffix of every generated name replaced by `-HASH`."""
    for _, name in generated:
        text = re.sub(rf"\b{re.escape(name)}-[a-z0-9]{{10}}\b", f"{name}-HASH", text)
    return text


def example_overlay(tmp: Path, database_url: str, migrate_url: str | None = None) -> Path:
    """A copy of deploy/kubernetes with the files the operator creates for the example overlay
    (secrets/database-url, the application role's URL, and secrets/migrate-database-url, the
    owner's: `migrate_url`, else the same URL); the overlay's directory in it."""
    tree = tmp / "kubernetes"
    source = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
    shutil.copytree(source, tree, ignore=shutil.ignore_patterns("secrets"))
    secrets = tree / "overlays" / "example" / "secrets"
    secrets.mkdir()
    (secrets / "database-url").write_text(database_url)
    (secrets / "migrate-database-url").write_text(migrate_url or database_url)
    return tree / "overlays" / "example"
