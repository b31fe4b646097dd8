"""`copies = K` on a peer tier: the settings read it as K peer tiers, the configured one and
`<name>.2` ... `<name>.K`, the same from the keyword arguments, TIERPOINT_TIERS and a dumped list;
`copies` on another kind, a derived name taken or too long are refused at start."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import ValidationError

from tierpoint.config import Settings
from tierpoint.tier_config import TierKind

SSD = {"name": "ssd", "kind": "local", "root": "/nvme/{node}/ssd"}
S3 = {"name": "s3", "kind": "s3", "bucket": "ckpt"}


def _peer(**extra: Any) -> dict[str, Any]:
    return {"name": "peer", "kind": "peer", "root": "/nvme/{node}/peer", **extra}


def test_a_peer_tier_with_copies_is_that_many_peer_tiers() -> None:
    settings = Settings(tiers=[SSD, _peer(copies=3, scrub_bandwidth=7), S3])
    got = [(t.name, t.kind, t.root, t.copy_of, t.copy_number) for t in settings.tiers]
    assert got == [
        ("ssd", TierKind.LOCAL, "/nvme/{node}/ssd", None, 1),
        ("peer", TierKind.PEER, "/nvme/{node}/peer", None, 1),
        ("peer.2", TierKind.PEER, "/nvme/{node}/peer.2", "peer", 2),
        ("peer.3", TierKind.PEER, "/nvme/{node}/peer.3", "peer", 3),
        ("s3", TierKind.S3, None, None, 1),
    ]
    # Each copy is a full peer tier with the configured one's options, in placement order.
    assert [t.name for t in settings.peer_tiers()] == ["peer", "peer.2", "peer.3"]
    assert {(t.copies, t.scrub_bandwidth, t.configured_name) for t in settings.peer_tiers()} == {
        (3, 7, "peer")
    }
    assert settings.tier("peer.3").root_for("node-b").as_posix() == "/nvme/node-b/peer.3"
    # One copy is the tier as configured, as before.
    assert Settings(tiers=[SSD, _peer(), S3]).tier_names() == ["ssd", "peer", "s3"]


def test_every_source_and_a_dumped_list_give_the_same_tiers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings(tiers=[SSD, _peer(copies=2), S3])
    monkeypatch.setenv("TIERPOINT_TIERS", json.dumps([SSD, _peer(copies=2), S3]))
    assert Settings().tiers == settings.tiers
    # What a worker's environment or the dev stack's stack.env carries: the copies listed.
    for dumped in (
        [t.model_dump(mode="json") for t in settings.tiers],
        [t.model_dump(mode="json", exclude_defaults=True) for t in settings.tiers],
    ):
        monkeypatch.setenv("TIERPOINT_TIERS", json.dumps(dumped))
        assert Settings().tiers == settings.tiers
    # A listed copy keeps what was changed on it.
    dumped = [t.model_dump(mode="json") for t in settings.tiers]
    dumped[2]["scrub_bandwidth"] = 0
    assert Settings(tiers=dumped).tier("peer.2").scrub_bandwidth == 0


@pytest.mark.parametrize(
    ("tiers", "message"),
    [
        (
            [{**SSD, "copies": 2}, _peer(), S3],
            "copies: peer tiers only, 'ssd' is local",
        ),
        ([SSD, _peer(), {**S3, "copies": 2}], "copies: peer tiers only, 's3' is s3"),
        (
            [SSD, _peer(copies=2), {"name": "peer.2", "kind": "shared", "root": "/x"}, S3],
            "its copy 2 is the tier 'peer.2', which is configured too",
        ),
        (
            [SSD, {**_peer(copies=2), "name": "p" * 127}, S3],
            f"its copy 2 would be named '{'p' * 127}.2', longer than tier names may be",
        ),
        ([SSD, _peer(copies=0), S3], "greater than 0"),
        (
            [SSD, _peer(), {**_peer(), "name": "peer.2", "copy_of": "peer", "copy_number": 2}],
            "copy_of and copy_number are set by the settings",
        ),
        (
            [
                SSD,
                _peer(),
                {**_peer(copies=2), "name": "peer.2", "copy_of": "peer", "copy_number": 2},
            ],
            "'peer.2' is listed as copy 2 of 'peer', which is no peer tier with that many copies",
        ),
    ],
)
def test_copies_the_settings_cannot_run_are_refused_at_start(
    tiers: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        Settings(tiers=tiers)
