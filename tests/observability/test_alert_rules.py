"""The example alert rules (docs/alerts.yml) use only metrics that the code exports: names are
collected from the real registries, the started API app's and a real worker process's /metrics,
so that a renamed metric fails here instead of silencing an alert."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import generate_latest

from api.app import create_app
from apps.devstack.services import free_port
from tests.helpers.api import running_client
from tests.helpers.scrape import names, scrape, wait_serving, worker_with_metrics
from tierpoint.config import Settings

RULES = Path(__file__).parents[2] / "docs" / "alerts.yml"
METRIC = re.compile(r"\btierpoint_[a-z0-9_]+\b")


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_every_rule_is_complete() -> None:
    rules = _rules()
    assert {r["alert"] for r in rules} >= {
        "TierpointCopyStuck",
        "TierpointRecoveryPointTooOld",
        "TierpointTierAlmostFull",
        "TierpointVerificationFailures",
    }
    for rule in rules:
        expr = rule["expr"]
        assert METRIC.search(expr), rule["alert"]
        assert expr.count("(") == expr.count(")"), rule["alert"]
        assert rule["labels"]["severity"] in ("page", "warn"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


async def test_every_metric_in_the_rules_is_exported(settings: Settings, tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "worker.log"
    app = create_app(settings)
    async for _ in running_client(app):
        exported = names(generate_latest(app.state.metrics.registry).decode())
    with worker_with_metrics(settings, ["--node", "node-rules", "--no-shared"], port, log) as w:
        async with asyncio.timeout(300):  # a hang guard only
            await wait_serving(w, port, log)
            exported |= names(await scrape(port))
    used = {(r["alert"], name) for r in _rules() for name in METRIC.findall(r["expr"])}
    unknown = sorted((alert, name) for alert, name in used if name not in exported)
    assert unknown == [], f"not exported: {unknown}"
