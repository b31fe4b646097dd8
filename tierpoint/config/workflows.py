"""The lifecycle's shape (batches, progress, heartbeats) and the periodic work: reconciliation,
the retention sweep and the scrub."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field, PositiveInt


class WorkflowSettings(BaseModel):
    # Workflow shape: history grows with batches, never with shards.
    shard_batch_size: PositiveInt = Field(
        default=500,
        description="Smallest number of shards per batch activity; batches are "
        "`max(shard_batch_size, ceil(S / max_batches_per_stage))` shards of one node.",
    )
    max_batches_per_stage: PositiveInt = Field(
        default=64,
        description="Target number of batches per stage (per node at least one).",
    )
    # A node with fewer batches than its stages' parallelism would copy its shards one after
    # another inside one activity; large shards are worth an activity each, tiny ones are not.
    min_batch_bytes: PositiveInt = Field(
        default=64 * 1024 * 1024,
        description="A node with fewer batches than the `parallelism` of the first two tiers "
        "(the stages on the nodes' queues) has its shards split into up to that many "
        "contiguous ranges balanced by bytes, none smaller than this (bytes).",
    )
    progress_interval_seconds: float = Field(
        default=1.0,
        description="Catalog progress writes (`replica.bytes_done`) per batch at most this "
        "often (seconds).",
    )
    # Progress is reported per chunk (8 MiB on POSIX), so a chunk at the slowest
    # read_bandwidth_limit must arrive well within it.
    batch_heartbeat_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A batch activity (seal, copy) whose worker has not heartbeated for this "
        "long is retried elsewhere, resuming from its last heartbeat: how long a killed "
        "worker's copy waits (seconds). Keep it well above 8 MiB / read_bandwidth_limit.",
    )
    reconcile_interval_seconds: float = Field(
        default=10.0,
        description="How often the shared worker's reconciler starts the workflows of "
        "registered checkpoints that have none (seconds).",
    )
    # Time-based rules such as keep_within change their answer without any promotion.
    retention_sweep_interval: timedelta = Field(
        default=timedelta(minutes=10),
        description="How often the retention sweep schedule requests a retention run for "
        "every job (ISO 8601 duration or seconds).",
    )
    scrub_enabled: bool = Field(
        default=True,
        description="Whether the shared worker keeps the `tierpoint.scrub` schedule, which reads "
        "verified replicas back and repairs the ones found bad (docs/integrity.md).",
    )
    scrub_interval: timedelta = Field(
        default=timedelta(minutes=10),
        gt=timedelta(0),
        description="How often a scrub run starts; each reads at most `scrub_bandwidth` x this "
        "interval bytes per tier (per node for a local tier).",
    )
    scrub_min_age: timedelta = Field(
        default=timedelta(days=7),
        ge=timedelta(0),
        description="A verified replica is read back again at most once per this period "
        "(counted from its last verification or scrub).",
    )
    reconcile_schedule_interval: timedelta | None = Field(
        default=None,
        description="If set, a `tierpoint.reconcile` schedule compares the catalog with every "
        "tier this often and repairs what it finds (off by default: it lists whole tiers).",
    )
    reconcile_grace: timedelta = Field(
        default=timedelta(hours=1),
        ge=timedelta(0),
        description="Temp files and multipart uploads older than this that no copy is writing "
        "are abandoned: reconciliation reports them and, with repair, removes them.",
    )
