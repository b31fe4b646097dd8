"""The client's models as parsed from the API's JSON: a checkpoint's copy on each tier is a
`TierCopy`, a name apart from the server's state enum (tierpoint.states.TierState)."""

from __future__ import annotations

import pytest
import tierpoint_client
from tierpoint_client import Checkpoint, TierCopy


def test_a_checkpoints_tiers_are_tier_copies() -> None:
    cp = Checkpoint.from_json(
        {
            "job": "j",
            "step": 3,
            "tiers": [
                {"tier": "ssd", "kind": "local", "state": "restorable"},
                {"tier": "s3", "state": "pending", "progress": {"bytes_done": 5}},
            ],
        }
    )
    ssd, s3 = cp.tiers
    assert isinstance(ssd, TierCopy) and cp.tier("ssd") == ssd
    assert s3.progress is not None and s3.progress.bytes_done == 5
    assert cp.restorable_tiers() == ["ssd"]


def test_the_old_name_still_imports_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="TierCopy"):
        old = tierpoint_client.TierState
    assert old is TierCopy
    with pytest.raises(AttributeError):
        _ = tierpoint_client.NoSuchName
