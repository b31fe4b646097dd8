"""docker-compose.yml against the Compose Specification's JSON schema, without a Docker engine.

The schema is the copy check-jsonschema vendors (`vendor/compose-spec.json`, from
compose-spec/compose-spec, Apache-2.0; the licence ships beside it), so the check runs offline
and its version moves with the locked check-jsonschema.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[2]
VENDOR = resources.files("check_jsonschema") / "builtin_schemas" / "vendor"


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema = json.loads((VENDOR / "compose-spec.json").read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    # yaml.safe_load resolves the `<<` merge keys and anchors as Compose does.
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def _errors(validator: Draft202012Validator, doc: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


def test_the_vendored_schema_is_the_compose_specification() -> None:
    schema = json.loads((VENDOR / "compose-spec.json").read_text())
    assert schema["title"] == "Compose Specification"
    assert "LICENSE.compose-spec" in {p.name for p in (VENDOR / "licenses").iterdir()}


def test_docker_compose_matches_the_compose_specification(
    validator: Draft202012Validator, compose: dict[str, Any]
) -> None:
    assert _errors(validator, compose) == []
    assert {"postgres", "temporal", "migrate", "api", "worker", "worker-node-1"} <= set(
        compose["services"]
    )


BREAKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "unknown service field": lambda c: c["services"]["api"].__setitem__("comand", ["api"]),
    "depends_on condition not in the spec": lambda c: c["services"]["api"]["depends_on"][
        "migrate"
    ].__setitem__("condition", "service_ready"),
    # (Integers may be strings in Compose, for interpolation: a list is what cannot be one.)
    "healthcheck retries a list": lambda c: c["services"]["postgres"]["healthcheck"].__setitem__(
        "retries", [30]
    ),
    "ports a mapping": lambda c: c["services"]["api"].__setitem__("ports", {"8080": 8080}),
    "unknown top-level key": lambda c: c.__setitem__("service", {}),
    "restart not a string": lambda c: c["services"]["worker"].__setitem__("restart", ["always"]),
}


@pytest.mark.parametrize("name", BREAKS)
def test_a_broken_compose_file_fails(
    name: str, validator: Draft202012Validator, compose: dict[str, Any]
) -> None:
    broken = copy.deepcopy(compose)
    BREAKS[name](broken)
    assert _errors(validator, broken) != []
