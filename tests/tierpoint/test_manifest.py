"""The manifest's JSON parsing: the fast path agrees with the Manifest model on every body (the
same values when both accept, the same errors otherwise), and the digest is the one registrations
have always been compared by."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.helpers.properties import examples
from tierpoint.manifest import Manifest
from tierpoint.manifest_digest import manifest_digest, shards_json
from tierpoint.manifest_parse import parse_manifest_json

MAX_INT64 = 2**63 - 1


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Usually a good value, sometimes a bad one: most manifests drawn have one flaw or none."""
    return st.integers(0, 11).flatmap(lambda k: bad if k == 0 else good)


sizes = mostly(
    st.one_of(st.integers(min_value=0, max_value=2**40), st.sampled_from([0, MAX_INT64, 1000.0])),
    st.sampled_from([-1, MAX_INT64 + 1, 2**64, 1.5, -0.0, 1e300, True, False, "1", None, []]),
)
crcs = mostly(
    st.one_of(
        st.none(),
        st.text(alphabet="0123456789abcdef", min_size=8, max_size=8),
        st.text(alphabet="0123456789abcdefABCDEF", min_size=8, max_size=8),
    ),
    st.one_of(
        st.sampled_from(["e306928", "e30692833", "e306928g", " e3069283", "e3069283\n", "٣" * 8]),
        st.text(alphabet="0123456789abcdefABCDEF\n", min_size=7, max_size=9),
        st.integers(0, 9),
    ),
)
nodes = mostly(
    st.one_of(
        st.sampled_from(["node-a", "node-b", "x" * 128, "n\u00e9", "n\x01"]),
        st.text(min_size=1, max_size=6).filter(
            lambda t: "\x00" not in t and not any(0xD800 <= ord(c) <= 0xDFFF for c in t)
        ),
    ),
    st.one_of(st.sampled_from(["", "a\x00b", "x" * 129, "\ud800"]), st.none(), st.integers()),
)
paths = mostly(
    st.one_of(
        st.sampled_from(
            ["a", "a/b", "dir/rank-0.pt", "é/ü", "a\u2028b", ".a", "..a", "a/" + "b" * 255]
        ),
        st.from_regex(r"\A[a-z0-9_]{1,6}(/[a-z0-9_.]{1,6}){0,3}\Z"),
    ),
    st.one_of(
        st.sampled_from(["../x", "/etc/passwd", "./a", "a//b", "a\\b", "", "a\ud800", "x.partial"]),
        st.sampled_from(["a/" + "b" * 256, "a\x01", "a/b/", "a/./b"]),
        st.text(max_size=12),
        st.integers(),
    ),
)


@st.composite
def shard(draw: st.DrawFn) -> Any:
    out: dict[str, Any] = {"path": draw(paths), "size": draw(sizes), "node": draw(nodes)}
    if draw(st.booleans()):
        out["crc32c"] = draw(crcs)
    if draw(st.integers(0, 40)) == 0:
        out[draw(st.sampled_from(["extra", "crc", "Path"]))] = 1
    if draw(st.integers(0, 40)) == 0:
        del out[draw(st.sampled_from(["path", "size", "node"]))]
    return out


metadata = mostly(
    st.dictionaries(
        st.text(max_size=4),
        st.one_of(st.none(), st.integers(-(2**110), 2**110), st.floats(), st.text(max_size=4)),
        max_size=3,
    ),
    st.sampled_from([[], "x", {"a\x00": 1}, {"deep": [[[[]]]]}]),
)


@st.composite
def body(draw: st.DrawFn) -> Any:
    shards = draw(st.lists(shard(), max_size=6, unique_by=lambda s: str(s.get("path"))))
    if shards and draw(st.integers(0, 8)) == 0:
        shards.append(dict(shards[0]))  # a duplicate path
    out: dict[str, Any] = {
        "step": draw(
            mostly(st.integers(0, 2**40), st.sampled_from([-1, 2**64, 3.0, 2.5, "4", True]))
        ),
        "shards": shards,
    }
    if draw(st.booleans()):
        out["metadata"] = draw(metadata)
    if draw(st.integers(0, 20)) == 0:
        out["other"] = 1
    return out


def _outcome(parse: Any, raw: bytes) -> tuple[str, Any]:
    try:
        m = parse(raw)
    except ValidationError as exc:
        # As JSON: an error's context may hold the exception raised, which compares by identity.
        return "refused", exc.json(include_url=False)
    return "accepted", (m.model_dump(), manifest_digest(m.shards), m.total_bytes)


@settings(max_examples=examples(1500), deadline=None)
@given(doc=body())
def test_the_fast_path_agrees_with_the_model(doc: Any) -> None:
    raw = json.dumps(doc).encode()
    assert _outcome(parse_manifest_json, raw) == _outcome(Manifest.model_validate_json, raw)


def _valid(n: int) -> bytes:
    shards = [
        {"path": f"m/layer-{i:03d}/rank-{i % 8}.pt", "size": i * 7, "node": f"node-{i % 2}"}
        | ({"crc32c": f"{i * 2654435761 % 2**32:08x}"} if i % 3 else {})
        for i in range(n)
    ]
    return json.dumps({"step": 5, "shards": shards[::-1], "metadata": {"loss": 0.5}}).encode()


def test_a_typical_manifest_takes_the_fast_path() -> None:
    raw = _valid(50)
    fast = parse_manifest_json(raw)
    assert type(fast) is not Manifest  # the fast subclass: nothing was validated twice
    slow = Manifest.model_validate_json(raw)
    assert fast.model_dump() == slow.model_dump()


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.update(crc32c="E3069283"),  # normalized to lower case by the model
        lambda s: s.update(size=1000.0),  # a JSON Schema integer
    ],
)
def test_what_only_the_model_accepts_is_accepted(change: Any) -> None:
    doc = json.loads(_valid(3))
    change(doc["shards"][1])
    m = parse_manifest_json(json.dumps(doc).encode())
    assert m == Manifest.model_validate_json(json.dumps(doc).encode())


def test_the_digest_is_the_canonical_sorted_shards() -> None:
    # The digest stored with every registration: a retry is compared by it, so it must never
    # change for the same shards (whatever computes it).
    m = parse_manifest_json(_valid(20))
    rows = [
        {"crc32c": s.crc32c, "node": s.node, "path": s.path, "size": s.size}
        for s in sorted(m.shards, key=lambda s: s.path)
    ]
    canonical = json.dumps(rows, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert manifest_digest(m.shards) == hashlib.sha256(canonical.encode()).hexdigest()
    doc = {
        "step": 1,
        "shards": [
            {"path": "b/é.pt", "size": 2, "crc32c": "E3069283", "node": "n\u00e9\x01"},
            {"path": "a.pt", "size": 1, "node": "node-a"},
        ],
    }
    pinned = "3d262db729a2f4b20e0841c395a1997040d4ee535b1085bbe4607557033e1320"  # as before
    assert manifest_digest(parse_manifest_json(json.dumps(doc).encode()).shards) == pinned


def test_shards_json_round_trips() -> None:
    m = parse_manifest_json(_valid(10))
    assert json.loads(shards_json(m.shards)) == [s.model_dump() for s in m.shards]
