"""Registration latency of POST /v1/jobs/{job}/checkpoints for large manifests.

Starts an embedded Postgres and Temporal dev server (or uses the ones given), applies the
migrations, runs the API under uvicorn in a subprocess on 127.0.0.1, and times N registrations of
new checkpoints with `--shards` shards each, as a training job would send them (one keep-alive
connection, time to the full response). Prints p50/p90/p99/max.

    .venv/bin/python benchmarks/register_latency.py --requests 200 --shards 1000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NODES = ("node-a", "node-b")


def serve(port: int) -> None:
    import uvicorn

    from api.app import create_app
    from tierpoint import logs
    from tierpoint.config import Settings

    settings = Settings()
    logs.configure("WARNING", json=False)
    uvicorn.run(create_app(settings), host="127.0.0.1", port=port, log_level="warning")


def _manifest(step: int, shards: int, rng: random.Random) -> bytes:
    body = {
        "step": step,
        "shards": [
            {
                "path": f"model/layer-{i // 8:04d}/rank-{i % 8}.safetensors",
                "size": rng.randrange(1, 1 << 32),
                "crc32c": f"{rng.getrandbits(32):08x}",
                "node": NODES[i % len(NODES)],
            }
            for i in range(shards)
        ],
        "metadata": {"loss": 1.0 / (step + 1), "tags": ["bench"]},
    }
    return json.dumps(body).encode()


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux), to report the API's CPU cost per request."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--database-url", help="an empty or migrated catalog; default: embedded")
    parser.add_argument("--temporal-address", help="default: embedded dev server")
    parser.add_argument(
        "--no-temporal", action="store_true", help="point the API at a closed port instead"
    )
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return

    from sqlalchemy.orm import Session

    from tierpoint.catalog import migrate, tokens_repo
    from tierpoint.catalog.engine import make_sync_engine
    from tierpoint.catalog.nodes import upsert_node
    from tierpoint.devstack.services import EmbeddedPostgres, TemporalDevServer, free_port

    stoppers = []
    server: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory(prefix="tierpoint-bench-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o755)  # the embedded Postgres runs as its own user when we are root
        try:
            url = args.database_url
            if not url:
                pg = EmbeddedPostgres(work / "pg")
                url = pg.start()
                stoppers.append(pg.stop)
            temporal = args.temporal_address
            if args.no_temporal:
                temporal = f"127.0.0.1:{free_port()}"
            elif not temporal:
                dev = TemporalDevServer(work / "temporal.db")
                temporal = dev.start(log_file=work / "temporal.log")
                stoppers.append(dev.stop)
            migrate.upgrade(url)
            engine = make_sync_engine(url, pool_size=1)
            with Session(engine) as s:
                for n in NODES:
                    upsert_node(s, n, {})
                # Requests authenticate as a training job does (TIERPOINT_TOKEN_CACHE_SECONDS=0
                # in the environment measures a catalog lookup per request).
                token = tokens_repo.create_token(
                    s, f"bench-{uuid.uuid4().hex[:8]}", ["train:bench-"], None
                ).secret
                s.commit()
            engine.dispose()

            port = free_port()
            tiers = [
                {"name": "ssd", "kind": "local", "root": str(work / "nodes" / "{node}")},
                {"name": "lustre", "kind": "shared", "root": str(work / "lustre")},
                {
                    "name": "s3",
                    "kind": "s3",
                    "bucket": "bench",
                    "endpoint_url": "http://127.0.0.1:9",
                },
            ]
            env = dict(
                os.environ,
                TIERPOINT_DATABASE_URL=url,
                TIERPOINT_TEMPORAL_ADDRESS=temporal,
                TIERPOINT_TIERS=json.dumps(tiers),
                TIERPOINT_CONFIG_FILE=str(work / "none.toml"),
            )
            server = subprocess.Popen(
                [sys.executable, __file__, "--serve", str(port)], env=env, cwd=ROOT
            )
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the API did not start")
                time.sleep(0.2)

            rng = random.Random(7)
            job = f"bench-{uuid.uuid4().hex[:8]}"
            total = args.warmup + args.requests
            bodies = [_manifest(step, args.shards, rng) for step in range(total)]
            headers = {"content-type": "application/json", "authorization": f"Bearer {token}"}
            created: list[float] = []
            cpu_before: float | None = None
            with httpx.Client(base_url=base, timeout=30) as client:
                for step, body in enumerate(bodies):
                    if step == args.warmup:
                        cpu_before = _cpu_seconds(server.pid)
                    t0 = time.perf_counter()
                    r = client.post(f"/v1/jobs/{job}/checkpoints", content=body, headers=headers)
                    elapsed = time.perf_counter() - t0
                    if r.status_code != 201:
                        raise SystemExit(f"step {step}: {r.status_code} {r.text[:500]}")
                    if step >= args.warmup:
                        created.append(elapsed)
                cpu_after = _cpu_seconds(server.pid)
                # The retry path: the same manifests again answer 200 without writing.
                again: list[float] = []
                for step in range(args.warmup, args.warmup + min(50, args.requests)):
                    t0 = time.perf_counter()
                    r = client.post(
                        f"/v1/jobs/{job}/checkpoints", content=bodies[step], headers=headers
                    )
                    again.append(time.perf_counter() - t0)
                    if r.status_code != 200:
                        raise SystemExit(f"retry of step {step}: {r.status_code} {r.text[:500]}")

            size_kb = statistics.mean(len(b) for b in bodies) / 1024
            print(
                f"registration of {args.shards}-shard manifests ({size_kb:.0f} KiB JSON), "
                f"{len(created)} requests after {args.warmup} warm-up, "
                f"temporal {'down' if args.no_temporal else 'up'}:"
            )
            if cpu_before is not None and cpu_after is not None:
                per = (cpu_after - cpu_before) / len(created) * 1000
                print(f"  API process CPU per new registration: {per:.1f} ms")
            for name, values in (("new (201)", created), ("retry (200)", again)):
                ms = [v * 1000 for v in values]
                print(
                    f"  {name:12s} p50 {_percentile(ms, 0.50):6.1f} ms  p90 "
                    f"{_percentile(ms, 0.90):6.1f} ms  p99 {_percentile(ms, 0.99):6.1f} ms  "
                    f"max {max(ms):6.1f} ms  (n={len(ms)})"
                )
        finally:
            if server is not None:
                server.terminate()
                server.wait(10)
            for stop in reversed(stoppers):
                stop()


if __name__ == "__main__":
    main()
