"""`tierpoint demo --job NAME` as a newcomer types it, against a dev stack's facts (its
stack.json names the real API of this module and the nodes' local roots): a name the server would
refuse is refused before a byte is written, with the rule in words."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import Engine

from apps.devstack.facts import S3Facts, StackInfo
from tests.helpers.tokens import create_token

RULE = "a job name is 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"


def test_demo_refuses_a_bad_job_name_before_it_writes_anything(
    api_url: str, nodes: tuple[str, str], catalog: Engine, tmp_path: Path
) -> None:
    """One that climbs out of the node's root, one with a space, one with `#`, one too long for a
    file name: before, the first wrote shards to nodes/node-a/etc/100 and only then got a 422,
    the next two left directories behind, the last ended in an OSError traceback."""
    stack = tmp_path / "dev"
    roots = {node: stack / "nodes" / node / "ssd" for node in nodes}
    for root in roots.values():
        root.mkdir(parents=True)
    s3 = S3Facts("http://127.0.0.1:9", "b", "us-east-1", "k", "s")
    facts = StackInfo(
        api_url, create_token(catalog), {n: str(r) for n, r in roots.items()}, None, s3
    )
    (stack / "stack.json").write_text(json.dumps(facts.to_json()))
    before = set(tmp_path.rglob("*"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERPOINT_")}
    for job in ("../etc", "two words", "run#7", "j" * 300):
        demo = ["demo", "--data-dir", str(stack), "--job", job, "--shard-size", "1KiB"]
        ran = subprocess.run(
            [sys.executable, "-m", "apps.cli.main", *demo, "--checkpoints", "1"],
            capture_output=True,
            text=True,
            env=env | {"COLUMNS": "200"},
            timeout=120,
        )
        said = " ".join((ran.stdout + ran.stderr).replace("│", " ").split())
        assert ran.returncode == 2, said
        assert RULE in said and "Traceback" not in said and "A-Za-z" not in said, said
    assert set(tmp_path.rglob("*")) == before
