"""`tierpoint dev --tiers` with an s3 tier on another endpoint (a real Ceph RADOS Gateway), tried
as a new user does it: the gateway's keys in the shell's AWS variables, the tier naming only its
`endpoint_url`. The stack keeps its own S3's keys for its own tiers, so the gateway tier signs
with the user's keys: ready, the demo restorable on it, a restore giving the original bytes."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apps.devstack.test_dev_stack_e2e import _cli, _env, _tail, run_demo, start_dev
from tests.helpers.s3_endpoints import S3Endpoint

pytestmark = pytest.mark.slow


@pytest.fixture
def root() -> Iterator[Path]:
    # Outside pytest's basetemp, as test_dev_stack_e2e's data dir (the Postgres user reads it).
    path = Path(tempfile.mkdtemp(prefix="tierpoint-e2e-rgw-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_tier_on_another_endpoint_signs_with_the_users_keys(rgw: S3Endpoint, root: Path) -> None:
    bucket = rgw.make_bucket()
    tiers = root / "tiers.toml"
    tiers.write_text(
        '[[tiers]]\nname = "ssd"\nkind = "local"\n\n'
        '[[tiers]]\nname = "lustre"\nkind = "shared"\n\n'
        f'[[tiers]]\nname = "s3"\nkind = "s3"\nbucket = "{bucket}"\n'
        f'endpoint_url = "{rgw.url}"\nregion = "{rgw.region}"\n'
    )
    users_keys = {
        "AWS_ACCESS_KEY_ID": rgw.access_key_id,
        "AWS_SECRET_ACCESS_KEY": rgw.secret_access_key,
    }
    env = {"TIERPOINT_CONFIG_FILE": str(root / "none.toml"), **users_keys}
    dev = start_dev(root / "dev", root / "dev.log", env=env, args=("--tiers", str(tiers)))
    job = f"rgw-{uuid.uuid4().hex[:8]}"
    try:
        with dev.api() as api:
            ready = api.get("/readyz")
            # Signed with the embedded S3's keys, the gateway answers 403 to the bucket check.
            assert ready.status_code == 200, ready.text
        run_demo(dev, job, checkpoints=1)
        objects = rgw.client().list_objects_v2(Bucket=bucket).get("Contents", [])
        assert len(objects) >= 4, objects

        dest = root / "restored"
        result = subprocess.run(
            _cli("restore", job, str(dest), "--data-dir", str(dev.data_dir), "--tier", "s3"),
            capture_output=True,
            text=True,
            env=_env() | users_keys,
            timeout=300,
        )
        assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        with dev.api() as api:
            cp = api.get(f"/v1/jobs/{job}/checkpoints/100").json()
        for shard in cp["shards"]:
            original = Path(dev.info.nodes[shard["node"]]) / job / "100" / shard["path"]
            assert (dest / shard["path"]).read_bytes() == original.read_bytes()
    finally:
        assert dev.interrupt() == 0, _tail(dev.log)
