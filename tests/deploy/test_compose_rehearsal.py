"""docker-compose.yml rehearsed without a Docker engine: the tierpoint services (migrate, api, the
shared worker, the node worker) run as local processes with the command and environment the file
gives them, against real Postgres, Temporal and S3. What only the compose network has is mapped
here, in COMPOSE_HOSTS and `_local_env`, and nothing else: the image's ENTRYPOINT `tierpoint`,
the services' host names, the MinIO keys, the named volumes' mount paths and the published port."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import text

from apps.devstack.services import free_port
from tests.helpers.rehearsal import REPO, Proc, running, wait_for
from tests.helpers.services import Services, fresh_database, make_bucket
from tierpoint.catalog.engine import make_sync_engine

COMPOSE = REPO / "docker-compose.yml"
SERVICES = ("migrate", "api", "worker", "worker-node-1")
WAIT = 180.0  # hang guard only


def _reported_in(database_url: str, node: str) -> None:
    """Until the node worker has registered its node in the catalog."""
    engine = make_sync_engine(database_url, pool_size=1)
    deadline = time.monotonic() + WAIT
    try:
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if conn.execute(text("SELECT 1 FROM node WHERE id = :n"), {"n": node}).first():
                    return
            time.sleep(0.5)
        raise AssertionError(f"node {node} never reported in")
    finally:
        engine.dispose()


def _local_env(
    environment: dict[str, Any], services: Services, database_url: str, bucket: str, work: Path
) -> dict[str, str]:
    """The service's environment with the compose network's values replaced by local ones."""
    env = {k: str(v) for k, v in environment.items()}
    assert env["TIERPOINT_DATABASE_URL"].startswith("postgresql+psycopg://tierpoint:")
    env["TIERPOINT_DATABASE_URL"] = database_url
    assert env["TIERPOINT_TEMPORAL_ADDRESS"] == "temporal:7233"
    env["TIERPOINT_TEMPORAL_ADDRESS"] = services.temporal_address
    tiers = json.loads(env["TIERPOINT_TIERS"])
    for tier in tiers:
        if "root" in tier:
            # The named volumes' mount paths (/mnt/ssd/{node}, /mnt/lustre) under `work`.
            tier["root"] = str(work / tier["root"].lstrip("/"))
        if tier["kind"] == "s3":
            assert tier["endpoint_url"] == "http://minio:9000"
            tier |= {"endpoint_url": services.s3_endpoint_url, "bucket": bucket}
    env["TIERPOINT_TIERS"] = json.dumps(tiers)
    # MinIO's keys -> the S3 stand-in's.
    env["AWS_ACCESS_KEY_ID"] = services.s3_access_key_id
    env["AWS_SECRET_ACCESS_KEY"] = services.s3_secret_access_key
    env["AWS_DEFAULT_REGION"] = services.s3_region
    return {
        **env,
        "PATH": f"{REPO / '.venv' / 'bin'}:/usr/bin:/bin",
        "HOME": str(work),
        "TIERPOINT_CONFIG_FILE": "/dev/null",  # the image has no tierpoint.toml
    }


def _process(name: str, service: dict[str, Any], env: dict[str, str], work: Path) -> Proc:
    argv = ["tierpoint", *service["command"]]  # the Dockerfile's ENTRYPOINT
    ports: dict[str, int] = {}
    for published in service.get("ports", []):
        container = published.rsplit(":", 1)[1]
        ports[container] = free_port()
        argv = [str(ports[container]) if a == container else a for a in argv]
    argv = ["127.0.0.1" if a == "0.0.0.0" else a for a in argv]
    log = work / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    return Proc(name, argv, env, ports, log)


def test_the_compose_services_run_as_written(
    services: Services, temporal_namespace: str, tmp_path: Path
) -> None:
    compose = yaml.safe_load(COMPOSE.read_text())["services"]
    database_url, bucket = fresh_database(services.database_url), make_bucket(services)
    work = tmp_path / "compose"
    procs = {}
    for name in SERVICES:
        env = _local_env(compose[name]["environment"], services, database_url, bucket, work)
        env["TIERPOINT_TEMPORAL_NAMESPACE"] = temporal_namespace  # one per test module
        procs[name] = _process(name, compose[name], env, work)
    node = procs["worker-node-1"].env["TIERPOINT_NODE"]
    assert "--node" not in procs["worker-node-1"].argv  # the node id comes from TIERPOINT_NODE
    for tier in json.loads(procs["api"].env["TIERPOINT_TIERS"]):
        if "root" in tier:
            Path(tier["root"].replace("{node}", node)).mkdir(parents=True, exist_ok=True)

    migrate = procs.pop("migrate")
    assert migrate.run() == 0, migrate.output()
    with running(list(procs.values())):
        api = procs["api"]
        wait_for(api, f"http://127.0.0.1:{api.ports['8080']}/readyz")
        _reported_in(database_url, node)
        assert all(p.alive() for p in procs.values()), [p.output() for p in procs.values()]
