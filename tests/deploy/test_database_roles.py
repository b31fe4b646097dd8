"""Two database roles, rehearsed as docs/deployment.md ("Postgres roles") sets them up: its SQL run
as written on the embedded Postgres (an owner role, an application role without CREATE), the
migrations Job of the example overlay migrating with the URL its Secret key gives it (the
owner's), then the API and the workers running as the application role through a checkpoint's
whole lifecycle and a restore. Since PostgreSQL 15 `PUBLIC` has no CREATE on `public`: the
application role itself cannot migrate, which the first test shows."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from tierpoint_client import build_manifest

from tests.client.conftest import _running_stack
from tests.helpers.client import read_tree, write_shards
from tests.helpers.db_roles import Roles, make_roles
from tests.helpers.kustomize import example_overlay, pod_spec, render
from tests.helpers.services import Services
from tests.helpers.worker_process import REPO

WAIT = 300.0  # hang guard only


@pytest.fixture
def roles(services: Services) -> Roles:
    return make_roles(services.database_url)


def _migrate(url: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "TIERPOINT_DATABASE_URL": url, "HOME": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "apps.cli.main", "migrate"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _job_database_url(overlay: Path) -> str:
    """The catalog URL the example overlay's migrations Job gets: its secretKeyRef resolved in
    the rendered Secret."""
    objects = render(overlay).objects
    job = next(o for o in objects if o["kind"] == "Job")
    spec = pod_spec(job)
    assert spec is not None
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    ref = env["TIERPOINT_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    secret = next(
        o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == ref["name"]
    )
    return base64.b64decode(secret["data"][ref["key"]]).decode()


def test_the_application_role_cannot_migrate(roles: Roles) -> None:
    refused = _migrate(roles.app_url)
    assert refused.returncode != 0
    assert "permission denied for schema public" in refused.stdout + refused.stderr


async def test_the_job_migrates_as_owner_and_the_pods_run_as_the_application_role(
    roles: Roles, services: Services, temporal_namespace: str, tmp_path: Path
) -> None:
    overlay = example_overlay(tmp_path / "kustomize", roles.app_url, roles.owner_url)
    job_url = _job_database_url(overlay)
    migrated = await asyncio.to_thread(_migrate, job_url)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr

    async with _running_stack(
        services, roles.app_url, temporal_namespace, tmp_path / "stack", ("node-a", "node-b")
    ) as stack:
        job, step, node = f"roles-{uuid.uuid4().hex[:8]}", 1, stack.nodes[0]
        local = stack.local_dir(node, job, step)
        shards = write_shards(local, {"a.distcp": 3 * 1024 * 1024, "b.distcp": 4096})
        manifest = build_manifest(local, node)
        await asyncio.to_thread(stack.client.register_manifest, job, step, manifest)
        for tier in ("lustre", "s3"):
            await stack.wait_restorable(job, step, tier, WAIT)
        await asyncio.to_thread(stack.client.restore, job, tmp_path / "restored", tier="s3")
        assert read_tree(tmp_path / "restored") == shards
