"""Prometheus metrics of the API process.

Each app gets its own registry (tests build several apps in one process; a global registry would
refuse the second set of collectors). They are served by a listener of their own
(`api_metrics_host`:`api_metrics_port`), never on the API's port: they name every job and its
recovery point, which a token of one job may not see.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

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

        # Computed from the catalog by the API's refresher (api/metrics_refresh.py): every API
        # replica exports the same values, so alert on max() across replicas.
        self.in_flight = Gauge(
            "tierpoint_checkpoints_in_flight",
            "Checkpoints whose copy to the tier is still pending (pending tier copies).",
            ["tier"],
            registry=r,
        )
        self.recovery_point_age = Gauge(
            "tierpoint_recovery_point_age_seconds",
            "Seconds since the latest checkpoint restorable from the tier was registered, by job.",
            ["job", "tier"],
            registry=r,
        )
        self.recovery_point_steps_behind = Gauge(
            "tierpoint_recovery_point_steps_behind",
            "Steps between the job's latest registered checkpoint and its latest one restorable "
            "from the tier.",
            ["job", "tier"],
            registry=r,
        )
        self.tier_free_bytes = Gauge(
            "tierpoint_tier_free_bytes",
            "Free bytes of a shared tier's file system, as the API process sees it.",
            ["tier"],
            registry=r,
        )
        self.tier_capacity_bytes = Gauge(
            "tierpoint_tier_capacity_bytes",
            "Capacity of a shared tier's file system, as the API process sees it.",
            ["tier"],
            registry=r,
        )
        self.catalog_refreshes = Counter(
            "tierpoint_api_catalog_metrics_refreshes",
            "Rounds of the refresher of the catalog gauges, by outcome (ok, error).",
            ["outcome"],
            registry=r,
        )
        self.catalog_refreshed = Gauge(
            "tierpoint_api_catalog_metrics_refreshed_timestamp_seconds",
            "Unix time of the last successful refresh of the catalog gauges.",
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> WSGIServer:
        """Expose /metrics on host:port (port 0: any free one, see `server.server_port`), as the
        workers do (tierpoint/metrics_worker.py). Stop it with `server.shutdown()`."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server
