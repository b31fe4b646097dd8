"""Prometheus metrics of the API process.

Each app gets its own registry (tests build several apps in one process; a global registry would
refuse the second set of collectors).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class ApiMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(
            "tierpoint_api_requests",
            "HTTP requests by route template, method and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "tierpoint_api_request_duration_seconds",
            "Time from request to the last byte of the response, by route template.",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.registrations = Counter(
            "tierpoint_api_registrations",
            "Checkpoint registrations accepted: created (new) or existing (same manifest again).",
            ["outcome"],
            registry=r,
        )
        self.registered_shards = Counter(
            "tierpoint_api_registered_shards", "Shards of newly registered checkpoints.", registry=r
        )
        self.conflicts = Counter(
            "tierpoint_api_registration_conflicts",
            "Registrations refused because a different manifest exists for the step.",
            registry=r,
        )
        self.problems = Counter(
            "tierpoint_api_problems",
            "Problem responses by stable error code.",
            ["code"],
            registry=r,
        )
        self.workflow_starts = Counter(
            "tierpoint_api_workflow_starts",
            "Lifecycle workflow starts after registration: started, existing or failed.",
            ["outcome"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
