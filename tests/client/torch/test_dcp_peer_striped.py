"""A large peer copy read for DCP by several ranged GETs at once (one per stripe, on connections
of its own), straight into the memory its placement gives, off a node's real data endpoint: the
exact bytes land; a flipped byte in a stripe or in a head the placement read is a mismatch (the
copy reported, the next copy read into the same memory); a stripe cut off is a read error
(nothing reported)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker
from tierpoint_client.peer import PEERS

from tests.client.torch.ranks import ROOT, TORCH_PYTHON
from tests.helpers.flip_proxy import flip_proxy
from tests.helpers.lifecycle import ShardSpec, crc_hex, seed_checkpoint
from tests.tierpoint.test_data_endpoint_reads import verified
from tierpoint.config import Settings
from tierpoint.services.data_endpoint import DataServer, serve
from tierpoint.storage.base import ShardRef
from tierpoint.storage.peer_http import shard_url

NODE = "node-a"
SECRET = "tp_worker-credential-of-this-test"
MiB = 1024 * 1024
SCRIPT = ROOT / "tests" / "client" / "torch" / "read_peer_placed.py"
# Above the client's STRIPED_MIN (32 MiB): read in 4 stripes of about 10 MiB.
SIZE = 41 * MiB + 12345
HEADS = [5 * MiB + 7, 23 * MiB]  # read first through `pread`, as DCP's placement does
SKIP = (30 * MiB, 31 * MiB + 5)  # bytes no item needs: read, verified, dropped


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return Settings.model_validate({**settings.model_dump(), "data_token": SECRET})


@pytest.fixture
def server(settings: Settings, sessions: sessionmaker[Session]) -> Iterator[DataServer]:
    srv = serve(settings, sessions, NODE, 0)
    yield srv
    srv.shutdown()
    srv.server_close()
    PEERS.close()


@pytest.fixture
def file_url(settings: Settings, sessions: sessionmaker[Session], server: DataServer) -> str:
    """The URL of a large file's verified copy on NODE's local tier, served by its endpoint."""
    job = f"striped-{uuid.uuid4().hex[:10]}"
    cp = seed_checkpoint(settings, sessions, job, 1, [ShardSpec(NODE, "big.bin", DATA, CRC)])
    verified(sessions, cp.checkpoint_id, ["big.bin"])
    return shard_url(server.url, "ssd", ShardRef(job, 1, "big.bin"))


DATA = os.urandom(SIZE)
CRC = crc_hex(DATA)
KEPT = crc_hex(DATA[: SKIP[0]] + DATA[SKIP[1] :])


def _read(copies: list[tuple[str, str]], heads: list[int]) -> dict[str, Any]:
    spec = {
        "path": "big.bin",
        "size": SIZE,
        "crc32c": CRC,
        "token": SECRET,
        "heads": heads,
        "skip": SKIP,
        "copies": [{"tier": t, "url": u} for t, u in copies],
    }
    done = subprocess.run(
        [str(TORCH_PYTHON), str(SCRIPT), json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _hostport(url: str) -> tuple[str, str]:
    rest = url.split("://", 1)[1]
    host, path = rest.split("/", 1)
    return host, "/" + path


def test_a_large_peer_copy_lands_exactly_its_bytes_over_several_ranged_gets(
    file_url: str,
) -> None:
    host, path = _hostport(file_url)
    with flip_proxy(host, 0) as proxy:
        got = _read([("peer", f"{proxy.url}{path}")], HEADS)
        responses = proxy.stats()["responses"]
    assert got["crc32c"] == KEPT
    assert got["read"] == {"big.bin": "peer"}
    assert got["reported"] == [] and got["warnings"] == [], got
    # One small GET per head the placement read, and one per stripe (a streamed read: one).
    assert responses == len(HEADS) + 4, responses


@pytest.mark.parametrize("where", ["stripe", "head"])
def test_a_flipped_byte_is_a_mismatch_and_the_next_copy_is_read(file_url: str, where: str) -> None:
    """The proxy damages the first response whose body it passes on: with no head read, a
    stripe's; else the first head's, whose bytes stay in memory as read (the stripe's bytes of
    them, undamaged, are dropped): the memory is what must verify."""
    host, path = _hostport(file_url)
    heads = HEADS if where == "head" else []
    with flip_proxy(host, 1) as proxy:
        got = _read([("peer-a", f"{proxy.url}{path}"), ("peer-b", file_url)], heads)
        stats = proxy.stats()
    assert stats["flipped"] == 1
    # Copy a was read whole, in its four stripes, before its combined crc32c condemned it.
    assert stats["responses"] == len(heads) + 4, stats
    assert got["crc32c"] == KEPT
    assert got["read"] == {"big.bin": "peer-b"}
    assert got["reported"] == ["peer-a"], got
    assert any("peer-a failed verification" in w for w in got["warnings"]), got


def test_a_cut_stripe_is_a_read_error_and_the_next_copy_is_read(file_url: str) -> None:
    host, path = _hostport(file_url)
    # Every response cut in its middle: with no head read, every stripe's.
    with flip_proxy(host, -1, cut=True) as proxy:
        got = _read([("peer-a", f"{proxy.url}{path}"), ("peer-b", file_url)], [])
        assert proxy.stats()["cut"] >= 1
    assert got["crc32c"] == KEPT
    assert got["read"] == {"big.bin": "peer-b"}
    # A network fault condemns no copy: nothing is reported.
    assert got["reported"] == [], got
    assert any("peer-a could not be read" in w for w in got["warnings"]), got
