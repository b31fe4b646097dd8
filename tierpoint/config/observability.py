"""Metrics and logs."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ObservabilitySettings(BaseModel):
    worker_metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="`tierpoint worker`: serve Prometheus /metrics on this port (unset: none).",
    )
    worker_metrics_host: str = Field(
        default="127.0.0.1",
        description="`tierpoint worker`: bind address of /metrics (`0.0.0.0` in a pod).",
    )
    metrics_refresh_seconds: float = Field(
        default=15.0,
        gt=0,
        description="`tierpoint api`: how often the catalog gauges of /metrics (recovery point "
        "age, checkpoints in flight, shared tier free space) are recomputed.",
    )
    log_json: bool = Field(default=False, description="Logs as JSON lines instead of text.")
    log_level: str = Field(default="INFO", description="Log level (`DEBUG`, `INFO`, ...).")
