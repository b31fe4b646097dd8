"""The recovery scenario's TierpointReader rows (its peer-tier stack, which runs from 64 MiB up,
so not in the smoke's tiny run): rank 1's state loaded with DCP on the spare node from its peer
copy, the shared tier and S3, each against the same load on its own node from its local tier, S3
also against the peer; every load read every byte of the checkpoint's files from the tier asked
for. One run of those methods alone (`--method TierpointReader`); no timing is judged."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks import quick

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = pytest.mark.full_stack

DCP = "4 nodes, peer tier, TierpointReader: rank 1's state"
LOCAL = f"{DCP} on its own node from its local tier"
SPARE = {
    "peer": f"{DCP} on the spare node from its peer copy",
    "shared": f"{DCP} on the spare node from the shared tier",
    "s3": f"{DCP} on the spare node from S3",
}


@pytest.mark.slow
def test_recovery_loads_rank_1s_state_with_tierpoint_reader_from_each_tier(
    tmp_path: Path,
) -> None:
    command = [*quick.QUICK, "--only", "recovery", "--mib", "64", "--method", "TierpointReader"]
    doc, _ = quick.invoke(command, tmp_path)
    quick.check_rows(doc)
    result = doc["scenarios"]["recovery"]
    rows = {r["label"]: r for r in result["rows"]}
    files = result["params"]["dcp files"]
    # Rank 1's file and DCP's metadata, every byte of both read from the one tier asked for.
    assert set(files) == {"__0_0.distcp", ".metadata"}
    for label in (LOCAL, *SPARE.values()):
        assert rows[f"{label}: bytes read from that tier"]["values"] == [sum(files.values())]
    for label in SPARE.values():
        assert rows[label]["baseline"] == LOCAL
    assert rows[f"{SPARE['s3']}, against the peer copy's"]["baseline"] == SPARE["peer"]
