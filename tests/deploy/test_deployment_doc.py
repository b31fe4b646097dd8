"""docs/deployment.md against the code: the IAM policy covers every S3 call the server makes, the
training pod template is a valid pod that mounts the tier roots the base config names, and every
`tierpoint` command, setting, environment variable and file the page names exists."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml

from apps.cli.main import app
from tests.helpers.manifest_rules import KUBERNETES_VERSION
from tierpoint.config import Settings
from tierpoint.tier_config import TierConfig, TierKind

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deployment.md"
TRAINING_POD = ROOT / "deploy" / "kubernetes" / "training-pod.yaml"
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
    pod: dict[str, object] = yaml.safe_load(TRAINING_POD.read_text())
    return pod


def test_the_training_pod_template_is_a_valid_pod_on_the_tier_roots() -> None:
    pod = _training_pod()
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    config = (ROOT / "deploy" / "kubernetes" / "base" / "tierpoint.toml").read_text()
    settings = Settings(**tomllib.loads(config))
    spec = pod["spec"]
    assert isinstance(spec, dict)
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    roots = {t.root for t in settings.tiers if t.kind is not TierKind.S3}
    # The tiers' roots, and the API's CA (TIERPOINT_API_TLS_CA) beside them.
    assert roots | {"/etc/tierpoint-api-ca"} == mounts
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {t.root for t in settings.tiers if t.kind is TierKind.LOCAL}


def test_a_broken_training_pod_fails_validation() -> None:
    pod = _training_pod()
    spec = pod["spec"]
    assert isinstance(spec, dict)
    spec["securityContext"]["supplementalGroups"] = "10001"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


# Names in backticks that are not tierpoint settings: Postgres roles, PgBouncer's settings, a
# retention policy's field, psycopg's option and Postgres's lock function.
FOREIGN_NAMES = {
    "tierpoint_app",
    "tierpoint_owner",
    "max_prepared_statements",
    "pool_mode",
    "max_db_connections",
    "max_client_conn",
    "keep_last",
    "when_required",
    "pg_dump",
    "pg_restore",
    "pg_advisory_xact_lock",
}
# What the image sets besides the settings (the settings file's path).
OTHER_VARIABLES = {"TIERPOINT_CONFIG_FILE"}


def _code(text: str) -> list[str]:
    """Fenced blocks and inline code spans."""
    fenced = re.findall(r"```\w*\n(.*?)```", text, re.S)
    rest = re.sub(r"```\w*\n.*?```", "", text, flags=re.S)
    return [*fenced, *re.findall(r"`([^`\n]+)`", rest)]


def invocations(text: str) -> list[list[str]]:
    """Every `tierpoint ...` command line in code (not `kubectl -n tierpoint ...`)."""
    found = []
    for chunk in _code(text):
        chunk = re.sub(r"\\\n\s*", " ", chunk)  # continued lines
        for line in chunk.splitlines():
            # Overlapping: `kubectl ... -n tierpoint exec ... -- tierpoint token ...`.
            for m in re.finditer(r"(?<![\w/.=-])tierpoint(?=((?: +[^\s|\\&]+)+))", line):
                before = line[: m.start()].split()
                words = m.group(1).split()
                # An option's value (`-n tierpoint`, `--name tierpoint`) or SQL, not a command.
                option_value = before and before[-1].startswith("-") and before[-1] != "--"
                if not option_value and re.match(r"[a-z]", words[0]):
                    found.append(words)
    return found


def command_problems(words: list[str]) -> list[str]:
    """Problems of `tierpoint WORDS`: an unknown command, or an option it does not have."""
    # typer's own click: its groups are known by their `commands`.
    command: Any = typer.main.get_command(app)
    path = ["tierpoint"]
    rest = list(words)
    while hasattr(command, "commands") and rest and rest[0] in command.commands:
        path.append(rest[0])
        command = command.commands[rest.pop(0)]
    if hasattr(command, "commands"):
        return [f"{' '.join(path + rest[:1])}: not a command"]
    options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    return [
        f"{' '.join(path)}: no option {w}"
        for w in rest
        if w.startswith("--") and w.split("=")[0] not in options
    ]


def test_every_tierpoint_command_in_the_doc_exists() -> None:
    found = invocations(DOC.read_text())
    assert ["token", "bootstrap"] in found and len(found) >= 10
    assert [p for words in found for p in command_problems(words)] == []


def test_a_wrong_command_or_option_would_be_caught() -> None:
    assert command_problems(["token", "boot"]) != []
    assert command_problems(["worker", "--nodes", "x"]) != []
    assert invocations("`kubectl -n tierpoint get pods`") == []


def test_every_setting_and_variable_in_the_doc_exists() -> None:
    text = DOC.read_text()
    fields = set(Settings.model_fields) | set(TierConfig.model_fields)
    named = set(re.findall(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`", text)) - FOREIGN_NAMES
    assert named - fields == set()
    for block in re.findall(r"```toml\n(.*?)```", text, re.S):
        data = tomllib.loads(block)
        assert set(data) - {"tiers"} <= set(Settings.model_fields), block
        for tier in data.get("tiers", []):
            TierConfig(**tier)
    client = "\n".join(p.read_text() for p in (ROOT / "client").rglob("*.py"))
    variables = {f"TIERPOINT_{name.upper()}" for name in Settings.model_fields}
    variables |= set(re.findall(r"TIERPOINT_[A-Z_]+", client)) | OTHER_VARIABLES
    assert set(re.findall(r"TIERPOINT_[A-Z_]+", text)) - variables == set()


def test_every_file_the_doc_names_exists() -> None:
    text = DOC.read_text()
    named = re.findall(
        r"`((?:deploy|docs|tests|tierpoint|client|api|overlays)/[\w./-]*|Dockerfile|"
        r"docker-compose\.yml)`",
        text,
    )
    kustomize = ROOT / "deploy" / "kubernetes"
    missing = [n for n in named if not (ROOT / n).exists() and not (kustomize / n).exists()]
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
    missing += [link for link in links if not (DOC.parent / link).exists()]
    assert missing == []
