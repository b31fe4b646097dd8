"""The scenarios, each built for a run's sizes: `python -m benchmarks --only NAME` picks them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.catalog_fill import Catalog
from benchmarks.env import Env
from benchmarks.harness import Scenario


@dataclass(frozen=True)
class Sizes:
    mib: int  # the data each data scenario moves per run
    copy_mib: int  # copy_posix: one shard of this size, and the same bytes in small shards
    small_mib: int  # copy_posix: the small shards' size
    requests: int  # registrations per run
    shards: int  # shards per registered manifest
    tensors: int  # tensors of the DCP state dict
    ckpt_shards: int  # shards of the checkpoint_visible, end_to_end and restore checkpoints
    window: float  # seconds the sustained scenario registers checkpoints for
    catalog: Catalog  # the 1x catalog of catalog_reads (it adds one 10x its checkpoints)
    reads: int  # GETs per run of catalog_reads
    orchestration: tuple[int, ...]  # shards per checkpoint of the orchestration scenario
    history: tuple[int, int]  # retention_snapshot: the job's checkpoints, shards per checkpoint
    replicas: tuple[int, ...]  # replica_writes: the replicas written per run
    scale: tuple[int, ...]  # scale: simulated nodes per run
    leases: int  # leases: requests per run, on one checkpoint or spread
    timeline: tuple[int, int] = (1_000_000, 10_000)  # timeline: checkpoints, branches
    # timeline: rounds of the two reads per run (a p99 of enough samples), a quarter as many
    # rollbacks
    timeline_samples: int = 2_000

    @classmethod
    def full(cls, mib: int | None = None) -> Sizes:
        return cls(
            mib=mib or 1024,
            copy_mib=mib or 2048,
            small_mib=8,
            requests=200,
            shards=1000,
            tensors=16,
            ckpt_shards=64,
            window=20.0,
            catalog=Catalog(1000, 100, 10),
            reads=300,
            orchestration=(1, 100, 1_000, 10_000, 100_000),
            history=(2_000, 100),
            replicas=(20, 500, 10_000),
            scale=(10, 100, 1_000),
            leases=10_000,
        )

    @classmethod
    def quick(cls, mib: int | None = None) -> Sizes:
        return cls(
            mib=mib or 16,
            copy_mib=mib or 16,
            small_mib=1,
            requests=20,
            shards=100,
            tensors=4,
            ckpt_shards=8,
            window=2.0,
            catalog=Catalog(100, 10, 10),
            reads=10,
            orchestration=(1, 100, 1_000),
            history=(100, 10),
            replicas=(20, 1_000),
            scale=(10,),
            leases=200,
            timeline=(20_000, 200),
            timeline_samples=80,
        )


def _copy_posix(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.copy_posix import CopyPosix

    return CopyPosix(env, s.copy_mib, small_mib=s.small_mib)


def _bandwidth_limit(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.bandwidth_limit import BandwidthLimit

    return BandwidthLimit(env, s.mib)


def _s3_upload(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.s3_upload import FULL_CELLS, QUICK_CELLS, S3Upload

    # Quick: one file of 16 MiB, so that 8 MiB parts still make a multipart upload.
    quick = s.mib < 256
    return S3Upload(env, s.mib, files=1 if quick else 4, cells=QUICK_CELLS if quick else FULL_CELLS)


def _s3_shaping(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.s3_shaping import S3Shaping

    if s.mib < 256:  # quick: a smoke of both proxies and both modes, seconds each
        only = ("direct", "limited, adaptive", "storm, standard")
        return S3Shaping(env, files=16, size=64 * 1024, threads=8, storm=0.5, only=only)
    return S3Shaping(env, files=200, size=256 * 1024, threads=16, storm=5.0)


def _register_latency(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.register_latency import RegisterLatency

    return RegisterLatency(env, s.requests, s.shards, warmup=10 if s.requests >= 100 else 3)


def _dcp(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.dcp import Dcp

    return Dcp(env, s.mib, tensors=s.tensors)


def _dcp_load(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.dcp_load import DcpLoad

    # Tiny runs (CI's smoke) load with one rank only: a second torch process costs seconds.
    return DcpLoad(env, s.mib, worlds=(1,) if s.mib < 64 else (1, 2))


def _dcp_requests(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.dcp_requests import DcpRequests

    # Quick: the smallest shape that still shows whether the count grows with the world size.
    return DcpRequests(env, (1, 2) if s.mib < 256 else (1, 2, 4, 8, 16))


def _torchtitan(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.torchtitan import Torchtitan

    # Tiny runs (CI's smoke): one rank; a second costs a torchtitan start-up.
    return Torchtitan(env, world=1 if s.mib < 64 else 2)


def _checkpoint_visible(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.checkpoint_visible import CheckpointVisible

    return CheckpointVisible(env, s.mib, shards=s.ckpt_shards)


def _end_to_end(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.end_to_end import EndToEnd

    return EndToEnd(env, s.mib, shards=s.ckpt_shards)


def _restore(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.restore import Restore

    return Restore(env, s.mib, shards=s.ckpt_shards)


def _recovery(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.recovery import Recovery

    return Recovery(env, s.mib, shards=s.ckpt_shards)


def _sustained(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.sustained import Sustained

    return Sustained(env, window=s.window)


def _catalog_reads(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.catalog_reads import CatalogReads

    return CatalogReads(env, s.catalog, s.reads, warmup=20 if s.reads >= 100 else 3)


def _memory(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.memory import Memory

    # 4 GiB at full size, where the data scenarios move 1 GiB.
    return Memory(env, 4 * s.mib)


def _orchestration(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.orchestration import Orchestration

    return Orchestration(env, s.orchestration)


def _retention_snapshot(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.retention_snapshot import RetentionSnapshot

    return RetentionSnapshot(env.work / "retention-snapshot", *s.history)


def _timeline(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.timeline import Timeline

    return Timeline(env.work / "timeline", *s.timeline, samples=s.timeline_samples)


def _replica_writes(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.replica_writes import ReplicaWrites

    return ReplicaWrites(env.work / "replica-writes", s.replicas)


def _scale(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.scale import Scale

    # Quick (the CI smoke): node workers in front of the dev stack the other scenarios started.
    idle = 2.0 if env.quick else 30.0
    return Scale(env, s.scale, own_services=not env.quick, idle=idle)


def _leases(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.leases import Leases

    return Leases(env, s.leases)


def _page_cache(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.page_cache import PageCache

    return PageCache(env, s.mib)


def _erasure(env: Env, s: Sizes) -> Scenario:
    from benchmarks.scenarios.erasure import Erasure

    # In memory: the data, its stripes for two codes and a copy of it are held at once.
    return Erasure(min(s.mib, 256), env)


SCENARIOS: dict[str, Callable[[Env, Sizes], Scenario]] = {
    "copy_posix": _copy_posix,
    "page_cache": _page_cache,
    "bandwidth_limit": _bandwidth_limit,
    "s3_upload": _s3_upload,
    "s3_shaping": _s3_shaping,
    "register_latency": _register_latency,
    "dcp": _dcp,
    "dcp_load": _dcp_load,
    "dcp_requests": _dcp_requests,
    "torchtitan": _torchtitan,
    "checkpoint_visible": _checkpoint_visible,
    "end_to_end": _end_to_end,
    "restore": _restore,
    "recovery": _recovery,
    "sustained": _sustained,
    "catalog_reads": _catalog_reads,
    "memory": _memory,
    "orchestration": _orchestration,
    "retention_snapshot": _retention_snapshot,
    "replica_writes": _replica_writes,
    "scale": _scale,
    "leases": _leases,
    "timeline": _timeline,
    "erasure": _erasure,
}
