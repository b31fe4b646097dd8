"""docs/deployment.md against the code: the IAM policy covers every S3 call the server makes, and
the training pod excerpt is a valid pod that mounts the tier roots the base config names."""

from __future__ import annotations

import json
import re
import textwrap
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.helpers.manifest_rules import KUBERNETES_VERSION
from tierpoint.config import Settings, TierKind

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deployment.md"
# The server's S3 calls: the S3 tier and the API's readiness check.
S3_CALLERS = [
    *sorted((ROOT / "tierpoint" / "storage" / "s3").glob("*.py")),
    ROOT / "api" / "routers" / "health.py",
]
# Paginators first: `client.get_paginator(` would otherwise match as a call of its own.
CALL = re.compile(r"client\.get_paginator\(\"(\w+)\"\)|client\.(\w+)\(|to_thread\(client\.(\w+),")


def _operation(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))


def s3_operations(sources: list[Path]) -> set[str]:
    found = set()
    for source in sources:
        for groups in CALL.findall(source.read_text()):
            name = next(g for g in groups if g)
            if name != "get_paginator":
                found.add(_operation(name))
    return found


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def _policy_table() -> dict[str, str]:
    """action -> the 'used for' cell, from the S3 section's table."""
    rows = re.findall(r"^\| `(s3:\w+)` \| [^|]+ \| (.+) \|$", _section("S3"), re.M)
    return dict(rows)


def _documented_operations(table: dict[str, str]) -> set[str]:
    return {op for used_for in table.values() for op in re.findall(r"`(\w+)`", used_for)}


def test_every_s3_call_of_the_server_is_in_the_policy_table() -> None:
    calls = s3_operations(S3_CALLERS)
    assert {"PutObject", "UploadPart", "ListParts", "HeadBucket", "ListObjectsV2"} <= calls
    missing = calls - _documented_operations(_policy_table())
    assert not missing, f"S3 calls without their IAM action in docs/deployment.md: {missing}"


def test_a_new_s3_call_would_be_caught(tmp_path: Path) -> None:
    extra = tmp_path / "copy_object.py"
    extra.write_text("client.copy_object(Bucket=b, Key=k, CopySource=s)\n")
    calls = s3_operations([*S3_CALLERS, extra])
    assert "CopyObject" in calls - _documented_operations(_policy_table())


def test_the_policy_json_grants_exactly_the_table() -> None:
    block = re.search(r"```json\n(.+?)```", _section("S3"), re.S)
    assert block is not None
    policy = json.loads(block.group(1))
    granted = {a for statement in policy["Statement"] for a in statement["Action"]}
    assert granted == set(_policy_table())


def _training_pod() -> dict[str, object]:
    block = re.search(r"```yaml\n(\s*spec:\n.+?)```", DOC.read_text(), re.S)
    assert block is not None
    excerpt = yaml.safe_load(textwrap.dedent(block.group(1)))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer"}, **excerpt}


def test_the_training_pod_excerpt_is_a_valid_pod_on_the_tier_roots() -> None:
    pod = _training_pod()
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    config = (ROOT / "deploy" / "kubernetes" / "base" / "tierpoint.toml").read_text()
    settings = Settings(**tomllib.loads(config))
    spec = pod["spec"]
    assert isinstance(spec, dict)
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    roots = {t.root for t in settings.tiers if t.kind is not TierKind.S3}
    assert roots == mounts
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {t.root for t in settings.tiers if t.kind is TierKind.LOCAL}


def test_a_broken_training_pod_fails_validation() -> None:
    pod = _training_pod()
    spec = pod["spec"]
    assert isinstance(spec, dict)
    spec["securityContext"]["supplementalGroups"] = "10001"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
