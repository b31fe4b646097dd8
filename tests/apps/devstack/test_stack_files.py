"""The facts `tierpoint dev` writes for other programs: stack.json and a sourceable stack.env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from tierpoint_client import Checkpoint

from apps.cli.demo import Tracked, parse_size, write_checkpoint
from apps.devstack.env_file import stack_env_text
from apps.devstack.facts import S3Facts, StackInfo, StackNotRunning, read_stack_info
from apps.devstack.paths import StackPaths
from apps.devstack.settings import build_settings
from apps.devstack.tiers import DEFAULT_TIERS, complete_tiers

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = pytest.mark.full_stack


def _info(tmp_path: Path) -> tuple[StackInfo, StackPaths]:
    paths = StackPaths(tmp_path / "dev dir")  # a space: the env file must quote
    s3 = S3Facts("http://127.0.0.1:5000", "tierpoint-dev", "us-east-1", "key", "se'cret")
    info = StackInfo(
        api_url="http://127.0.0.1:8080",
        token=None,
        nodes={n: str(paths.data_dir / "nodes" / n / "ssd") for n in ("node-1", "node-2")},
        shared_root=str(paths.data_dir / "lustre"),
        s3=s3,
        tiers=[{"name": "ssd", "kind": "local", "root": "x"}],
    )
    return info, paths


def test_stack_json_has_exactly_the_documented_keys(tmp_path: Path) -> None:
    info, _ = _info(tmp_path)
    data = info.to_json()
    assert set(data) == {
        "api_url",
        "token",
        "nodes",
        "shared_root",
        "s3",
        "metrics_url",
        "tiers",
    }
    assert set(data["s3"]) == {
        "endpoint_url",
        "bucket",
        "region",
        "access_key_id",
        "secret_access_key",
    }
    (tmp_path / "stack.json").write_text(json.dumps(data))
    assert read_stack_info(tmp_path) == info


def test_missing_stack_json_says_how_to_start_one(tmp_path: Path) -> None:
    with pytest.raises(StackNotRunning, match="tierpoint dev"):
        read_stack_info(tmp_path)


def test_stack_env_lets_a_worker_join_the_stack(tmp_path: Path) -> None:
    """Sourcing stack.env gives a process the same Settings as the stack's own workers."""
    info, paths = _info(tmp_path)
    settings = build_settings(
        database_url="postgresql+psycopg://postgres@/tierpoint?host=/tmp/x y",
        temporal_address="127.0.0.1:7233",
        tiers=complete_tiers(list(DEFAULT_TIERS), paths, 2, info.s3),
        api_port=8080,
    )
    env_file = tmp_path / "stack.env"
    env_file.write_text(stack_env_text(info, settings, paths.data_dir))
    probe = (
        "import json; from tierpoint.config import Settings; "
        "print(json.dumps(Settings().model_dump(mode='json')))"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TIERPOINT_", "AWS_"))}
    out = subprocess.run(
        ["bash", "-c", f'source "$1" && exec "{sys.executable}" -c "{probe}"', "_", env_file],
        capture_output=True,
        text=True,
        check=True,
        env=clean,
        cwd=tmp_path,
    ).stdout
    joined = json.loads(out)
    assert joined["database_url"] == settings.database_url
    assert joined["temporal_address"] == settings.temporal_address
    assert joined["tiers"] == settings.model_dump(mode="json")["tiers"]
    shell = subprocess.run(
        [
            "bash",
            "-c",
            'source "$1" && printf "%s|%s|%s" "$TIERPOINT_API_URL" '
            '"$TIERPOINT_DEV_S3_SECRET_ACCESS_KEY" "$TIERPOINT_NODE_ROOT_NODE_2"',
            "_",
            env_file,
        ],
        capture_output=True,
        text=True,
        check=True,
        env=clean,
    ).stdout
    assert shell == f"{info.api_url}|se'cret|{info.nodes['node-2']}"
    # The stack's S3 keys go under its own names, which only its tiers read: AWS_* would hand
    # them to a tier of any other endpoint in that shell too.
    assert "AWS_ACCESS_KEY_ID" not in env_file.read_text()
    assert {t["credentials_env"] for t in joined["tiers"] if t["kind"] == "s3"} == {
        "TIERPOINT_DEV_S3"
    }


def test_stack_env_puts_the_stacks_tierpoint_on_path_and_names_its_data_dir(
    tmp_path: Path,
) -> None:
    """`source DIR/stack.env; tierpoint status` from any directory, in a shell whose PATH has no
    venv: it reaches the stack of DIR, not the default data dir."""
    info, paths = _info(tmp_path)
    settings = build_settings(
        database_url="postgresql+psycopg://x@/y",
        temporal_address="127.0.0.1:1",
        tiers=complete_tiers(list(DEFAULT_TIERS), paths, 2, info.s3),
        api_port=8080,
    )
    env_file = tmp_path / "stack.env"
    env_file.write_text(stack_env_text(info, settings, paths.data_dir))
    bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run(
        [
            "bash",
            "-c",
            'source "$1" && tierpoint --help >/dev/null && echo "$TIERPOINT_DATA_DIR"',
            "_",
            env_file,
        ],
        capture_output=True,
        text=True,
        env=bare,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(paths.data_dir)


def test_parse_size() -> None:
    assert parse_size("4MiB") == 4 * 1024 * 1024
    assert parse_size("512 KiB") == 512 * 1024
    assert parse_size("1000") == 1000
    assert parse_size("2mb") == 2_000_000
    for bad in ("", "4 parsecs", "-1", "MiB"):
        with pytest.raises(typer.BadParameter):
            parse_size(bad)


def test_demo_writes_shards_under_job_and_step_on_each_node(tmp_path: Path) -> None:
    import random

    import crc32c

    nodes = {"node-1": str(tmp_path / "n1"), "node-2": str(tmp_path / "n2")}
    specs = write_checkpoint(nodes, "job-x", 200, 3, 1000, random.Random(1))
    assert [s.node for s in specs] == ["node-1", "node-2", "node-1"]
    for s in specs:
        data = (Path(nodes[s.node]) / "job-x" / "200" / s.path).read_bytes()
        assert len(data) == s.size == 1000
        assert s.crc32c == f"{crc32c.crc32c(data):08x}"
    # No temp files are left next to the shards.
    leftovers = [p for p in tmp_path.rglob(".*.tmp")]
    assert leftovers == []


def _checkpoint(states: dict[str, str], quarantine: str | None = None) -> Checkpoint:
    return Checkpoint.from_json(
        {
            "job": "j",
            "step": 100,
            "created_at": None,
            "metadata": {},
            "pinned": False,
            "quarantine_reason": quarantine,
            "total_bytes": 10,
            "shard_count": 1,
            "tiers": [
                {"tier": t, "kind": "local", "state": s, "reason": f"why {t}", "progress": None}
                for t, s in states.items()
            ],
        }
    )


def test_demo_counts_a_checkpoint_done_only_when_every_tier_settled_and_failed_if_any_failed() -> (
    None
):
    tracked = Tracked(step=100, registered_at=0.0)
    assert not tracked.done and tracked.failed == []
    tracked.last = _checkpoint({"ssd": "restorable", "lustre": "pending", "s3": "pending"})
    assert not tracked.done
    tracked.last = _checkpoint({"ssd": "expired", "lustre": "restorable", "s3": "restorable"})
    assert tracked.done and tracked.failed == []
    tracked.last = _checkpoint({"ssd": "restorable", "lustre": "failed", "s3": "failed"})
    assert tracked.done
    assert tracked.failed == ["lustre: failed (why lustre)", "s3: failed (why s3)"]
    tracked.last = _checkpoint({"ssd": "restorable"}, quarantine="bad load")
    assert tracked.failed == ["quarantined: bad load"]
