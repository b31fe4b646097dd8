"""`tierpoint dev` runs the tiers the user configured (TIERPOINT_TIERS, the config file, or
`--tiers FILE`), with only what a tier leaves out filled in by the stack; the example tier files
run as they are. One real dev stack, started with a RAM -> S3 list in TIERPOINT_TIERS."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from apps.devstack.facts import BUCKET, S3Facts
from apps.devstack.paths import StackPaths
from apps.devstack.tiers import DevTiersError, complete_tiers, requested_tiers
from tests.apps.devstack.test_dev_stack_e2e import (
    DevProcess,
    _cli,
    _env,
    _tail,
    start_dev,
)
from tierpoint.tier_config import TierKind

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = pytest.mark.full_stack

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "tiers"
S3 = S3Facts("http://127.0.0.1:5999", BUCKET, "us-east-1", "key", "secret")


@pytest.fixture
def no_tier_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIERPOINT_TIERS", raising=False)


def test_the_example_tier_files_run_on_the_dev_stack(
    tmp_path: Path, no_tier_settings: None
) -> None:
    expected = {
        "default.toml": [("ssd", "local"), ("lustre", "shared"), ("s3", "s3")],
        "ram-s3.toml": [("ram", "local"), ("s3", "s3")],
        "ssd-lustre-s3.toml": [("ssd", "local"), ("lustre", "shared"), ("s3", "s3")],
        "ssd-peer-lustre-s3.toml": [
            ("ssd", "local"),
            ("peer", "peer"),
            ("lustre", "shared"),
            ("s3", "s3"),
        ],
    }
    assert sorted(p.name for p in EXAMPLES.glob("*.toml")) == sorted(expected)
    for name, kinds in expected.items():
        requested = requested_tiers(EXAMPLES / name)
        tiers = complete_tiers(requested.tiers, StackPaths(tmp_path), 2, S3)
        assert [(t.name, t.kind.value) for t in tiers] == kinds, name
        assert all(t.endpoint_url == S3.endpoint_url for t in tiers if t.kind is TierKind.S3)
    ram = complete_tiers(
        requested_tiers(EXAMPLES / "ram-s3.toml").tiers, StackPaths(tmp_path), 2, S3
    )
    assert ram[0].root == "/dev/shm/tierpoint/{node}"
    peer = complete_tiers(
        requested_tiers(EXAMPLES / "ssd-peer-lustre-s3.toml").tiers, StackPaths(tmp_path), 2, S3
    )
    # Each simulated node holds its peers' copies in a root of its own.
    assert peer[1].root == str(tmp_path / "nodes" / "{node}" / "peer")
    # `copies = 2`, as the example's comment says: two peer tiers, the second in `<root>.2`.
    two = requested_tiers(EXAMPLES / "ssd-peer-lustre-s3.toml").tiers
    two[1]["copies"] = 2
    copies = complete_tiers(two, StackPaths(tmp_path), 3, S3)
    assert [(t.name, t.root, t.copy_of) for t in copies[1:3]] == [
        ("peer", str(tmp_path / "nodes" / "{node}" / "peer"), None),
        ("peer.2", str(tmp_path / "nodes" / "{node}" / "peer.2"), "peer"),
    ]


def test_the_users_list_is_kept_and_only_its_gaps_are_filled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = [
        {"name": "ram", "kind": "local", "root": "/dev/shm/t/{node}"},
        {"name": "nvme", "kind": "local"},
        {"name": "fs", "kind": "shared"},
        {"name": "old", "kind": "s3", "endpoint_url": "http://127.0.0.1:1"},  # a dead stack's
        {"name": "mine", "kind": "s3", "bucket": "b", "endpoint_url": "http://minio:9000"},
    ]
    monkeypatch.setenv("TIERPOINT_TIERS", json.dumps(given))
    requested = requested_tiers()
    assert (requested.tiers, requested.origin) == (given, "TIERPOINT_TIERS")
    paths = StackPaths(tmp_path)
    ram, nvme, fs, old, mine = complete_tiers(requested.tiers, paths, 2, S3)
    assert ram.root == "/dev/shm/t/{node}"
    assert nvme.root == str(tmp_path / "nodes" / "{node}" / "nvme")
    assert fs.root == str(tmp_path / "fs")
    assert (old.bucket, old.endpoint_url) == (BUCKET, S3.endpoint_url)
    assert (mine.bucket, mine.endpoint_url) == ("b", "http://minio:9000")
    # --tiers FILE before the environment.
    file = tmp_path / "tiers.toml"
    file.write_text('[[tiers]]\nname = "only"\nkind = "local"\n')
    assert [t["name"] for t in requested_tiers(file).tiers] == ["only"]


def test_a_list_the_dev_stack_cannot_run_is_refused_in_one_line(
    tmp_path: Path, no_tier_settings: None
) -> None:
    paths = StackPaths(tmp_path)
    shared_root = [{"name": "ram", "kind": "local", "root": "/dev/shm/t"}]
    with pytest.raises(DevTiersError, match=r"has no \{node\}"):
        complete_tiers(shared_root, paths, 2, None)
    assert complete_tiers(shared_root, paths, 1, None)[0].root == "/dev/shm/t"
    with pytest.raises(DevTiersError, match="has none"):
        complete_tiers([{"name": "s3", "kind": "s3"}], paths, 2, None)
    with pytest.raises(DevTiersError, match="unique"):
        complete_tiers(
            [{"name": "a", "kind": "local"}, {"name": "a", "kind": "shared"}], paths, 2, None
        )
    with pytest.raises(DevTiersError, match="copies: peer tiers only"):
        complete_tiers([{"name": "a", "kind": "local", "copies": 2}], paths, 1, None)
    empty = tmp_path / "empty.toml"
    empty.write_text("database_url = 'x'\n")
    with pytest.raises(DevTiersError, match="no `tiers`"):
        requested_tiers(empty)


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    # Outside pytest's basetemp, as tests/apps/devstack/test_dev_stack_e2e.py explains.
    root = Path(tempfile.mkdtemp(prefix="tierpoint-devtiers-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def ram_s3(work: Path) -> Iterator[DevProcess]:
    """The RAM -> S3 example as a user sets it in the environment (the root under the test's own
    directory instead of /dev/shm)."""
    tiers = requested_tiers(EXAMPLES / "ram-s3.toml").tiers
    tiers[0]["root"] = str(work / "shm" / "{node}")
    env = {"TIERPOINT_TIERS": json.dumps(tiers)}
    running = start_dev(work / "dev", work / "dev.log", env=env)
    yield running
    if running.proc.poll() is None:
        running.interrupt()


@pytest.mark.slow
def test_the_dev_stack_runs_the_configured_tiers_and_promotes_through_them(
    ram_s3: DevProcess, work: Path
) -> None:
    info = ram_s3.info
    with ram_s3.api() as api:
        tiers = api.get("/v1/tiers").json()
    assert [(t["name"], t["kind"]) for t in tiers] == [("ram", "local"), ("s3", "s3")]
    assert [(t["name"], t["kind"]) for t in info.tiers] == [("ram", "local"), ("s3", "s3")]
    assert info.tiers[1]["endpoint_url"] == info.s3.endpoint_url
    assert info.nodes == {n: str(work / "shm" / n) for n in ("node-1", "node-2")}
    assert info.shared_root is None
    # One line per tier in the startup output, where each keeps its copies.
    started = ram_s3.log.read_text()
    assert "ram -> s3  (from TIERPOINT_TIERS)" in started
    assert re.search(rf"\bram +local  {re.escape(str(work / 'shm' / '{node}'))}", started)
    s3_line = rf"\bs3 +s3  s3://{BUCKET}/ram-s3/ at {re.escape(info.s3.endpoint_url)}"
    assert re.search(s3_line, started), started

    job = f"tiers-{uuid.uuid4().hex[:8]}"
    demo = subprocess.run(
        _cli(
            "demo",
            *("--data-dir", str(ram_s3.data_dir), "--job", job, "--checkpoints", "1"),
            *("--shards", "2", "--shard-size", "256KiB", "--interval", "0.5"),
        ),
        capture_output=True,
        text=True,
        env=_env() | {"COLUMNS": "200"},
        timeout=600,
    )
    assert demo.returncode == 0, demo.stdout[-4000:] + "\n" + _tail(ram_s3.log)
    with ram_s3.api() as api:
        cp = api.get(f"/v1/jobs/{job}/checkpoints/100").json()
    assert {t["tier"]: t["state"] for t in cp["tiers"]} == {"ram": "restorable", "s3": "restorable"}
    s3 = boto3.client(
        "s3",
        endpoint_url=info.s3.endpoint_url,
        region_name=info.s3.region,
        aws_access_key_id=info.s3.access_key_id,
        aws_secret_access_key=info.s3.secret_access_key,
    )
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"ram-s3/{job}/100/")
    assert listed["KeyCount"] == cp["shard_count"] > 0
    assert any((work / "shm" / "node-1" / job / "100").iterdir())
