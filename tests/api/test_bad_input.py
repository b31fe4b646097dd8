"""Invariant 6: bad input gets a 4xx problem+json with a stable code and changes nothing."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from api.app import create_app
from tests.helpers.api import NODE_A, NODE_B, counts, manifest, running_client, shard
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.config import Settings

PROBLEM = "application/problem+json"


def _valid() -> dict[str, Any]:
    return manifest(5, [shard("model/rank0.pt", NODE_A), shard("model/rank1.pt", NODE_B)])


def _shard0(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        body["shards"][0].update(changes)

    return mutate


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        body[key] = value

    return mutate


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        del body[key]

    return mutate


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"x": value}
    return value


def _duplicate(body: dict[str, Any]) -> None:
    body["shards"][1]["path"] = body["shards"][0]["path"]


def _sizes(first: int, second: int) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        body["shards"][0]["size"], body["shards"][1]["size"] = first, second

    return mutate


def _paths(first: str, second: str) -> Callable[[dict[str, Any]], None]:
    """Two shards at these paths, on different nodes (as gathered from two ranks)."""

    def mutate(body: dict[str, Any]) -> None:
        body["shards"][0]["path"], body["shards"][1]["path"] = first, second

    return mutate


BAD_BODIES: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    # (case id, mutation, code, text the problem must mention)
    ("dotdot", _shard0(path="../x"), "unsafe_path", "shards[0].path"),
    ("absolute", _shard0(path="/etc/passwd"), "unsafe_path", "absolute"),
    ("dotdot-inside", _shard0(path="a/../../b"), "unsafe_path", ".."),
    ("dot", _shard0(path="./a"), "unsafe_path", "shards[0].path"),
    ("backslash", _shard0(path="a\\..\\b"), "unsafe_path", "backslash"),
    ("empty-path", _shard0(path=""), "unsafe_path", "shards[0].path"),
    ("nul-path", _shard0(path="a\x00b"), "unsafe_path", "shards[0].path"),
    ("double-slash", _shard0(path="a//b"), "unsafe_path", "shards[0].path"),
    ("duplicate-path", _duplicate, "invalid_manifest", "appears twice"),
    # A file and a directory of one name: no tier can hold both.
    ("file-and-dir", _paths("model", "model/rank1.pt"), "invalid_manifest", "path_conflict"),
    ("dir-and-file", _paths("m/x/y.pt", "m/x"), "invalid_manifest", "cannot both be files"),
    ("negative-size", _shard0(size=-1), "invalid_manifest", "shards[0].size"),
    ("string-size", _shard0(size="10"), "invalid_manifest", "shards[0].size"),
    ("float-size", _shard0(size=1.5), "invalid_manifest", "shards[0].size"),
    # Sizes are bounded where every total the catalog keeps stays exact (2^53 - 1).
    ("huge-size", _shard0(size=2**63), "size_out_of_range", "shards[0].size"),
    ("size-int64-max", _shard0(size=2**63 - 1), "size_out_of_range", "9007199254740991"),
    ("size-2^53", _shard0(size=2**53), "size_out_of_range", "shards[0].size"),
    ("total-over-2^53", _sizes(2**52, 2**52), "size_out_of_range", "total_size_too_large"),
    ("crc-xyz", _shard0(crc32c="xyz"), "invalid_manifest", "shards[0].crc32c"),
    ("crc-7", _shard0(crc32c="1234567"), "invalid_manifest", "8 hex digits"),
    ("crc-9", _shard0(crc32c="123456789"), "invalid_manifest", "8 hex digits"),
    ("crc-zzz", _shard0(crc32c="zzzzzzzz"), "invalid_manifest", "8 hex digits"),
    ("crc-int", _shard0(crc32c=12345678), "invalid_manifest", "shards[0].crc32c"),
    ("empty-node", _shard0(node=""), "invalid_manifest", "shards[0].node"),
    ("extra-field", _shard0(owner="me"), "invalid_manifest", "shards[0].owner"),
    ("empty-shards", _set("shards", []), "invalid_manifest", "shards"),
    ("no-shards", _drop("shards"), "invalid_manifest", "shards"),
    ("no-step", _drop("step"), "invalid_manifest", "step"),
    ("negative-step", _set("step", -1), "invalid_manifest", "step"),
    ("string-step", _set("step", "5"), "invalid_manifest", "step"),
    # Steps are bounded where JavaScript holds integers exactly (the dashboard).
    ("step-2^53", _set("step", 2**53), "step_out_of_range", "2^53-1"),
    ("step-int64-max", _set("step", 2**63 - 1), "step_out_of_range", "9007199254740991"),
    ("metadata-list", _set("metadata", [1, 2]), "invalid_manifest", "metadata"),
    ("metadata-nul", _set("metadata", {"a": "x\x00y"}), "invalid_manifest", "metadata"),
    ("metadata-surrogate", _set("metadata", {"k\ud800": "v"}), "invalid_manifest", "Invalid JSON"),
    ("metadata-nan", _set("metadata", {"loss": float("nan")}), "invalid_manifest", "metadata"),
    ("metadata-deep", _set("metadata", _deep(40)), "invalid_manifest", "deeper"),
    # A lone surrogate escape is not Unicode text: the JSON itself is refused.
    ("path-surrogate", _shard0(path="a\ud800"), "invalid_manifest", "Invalid JSON"),
    ("node-surrogate", _shard0(node="n\ud800"), "invalid_manifest", "Invalid JSON"),
    ("node-nul", _shard0(node="n\x00"), "invalid_manifest", "shards[0].node"),
    ("extra-surrogate-key", _shard0(**{"\ud800": 1}), "invalid_manifest", "Invalid JSON"),
]


@pytest.mark.parametrize(
    ("mutate", "code", "mention"),
    [pytest.param(m, c, t, id=i) for i, m, c, t in BAD_BODIES],
)
async def test_bad_manifest_is_refused_and_writes_nothing(
    client: httpx.AsyncClient,
    catalog: Engine,
    job: str,
    mutate: Callable[[dict[str, Any]], None],
    code: str,
    mention: str,
) -> None:
    body = copy.deepcopy(_valid())
    mutate(body)
    before = counts(catalog)
    # json.dumps escapes lone surrogates (httpx's json= would refuse to encode them).
    r = await client.post(
        f"/v1/jobs/{job}/checkpoints",
        content=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == PROBLEM
    problem = r.json()
    assert problem["code"] == code, problem
    assert problem["status"] == 422
    assert mention in r.text
    assert problem["errors"], problem
    assert counts(catalog) == before
    # The same request made valid goes through: the refusal was about the mutation.
    ok = await client.post(f"/v1/jobs/{job}/checkpoints", json=_valid())
    assert ok.status_code == 201, ok.text


@pytest.mark.query_unit
async def test_unknown_and_lost_nodes_are_named(
    client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    """A unit test of registration's node check: no operator action declares a node lost yet, so
    `lost_at` is written here with SQL. Unknown nodes are refused end to end in
    tests/client/test_client_stack.py."""
    lost = f"node-lost-{uuid.uuid4().hex[:6]}"
    with Session(catalog) as s:
        upsert_node(s, lost, {})
        s.execute(text("UPDATE node SET lost_at = now() WHERE id = :n"), {"n": lost})
        s.commit()
    body = manifest(1, [shard("a", "node-nowhere"), shard("b", lost), shard("c", NODE_A)])
    before = counts(catalog)
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 422
    problem = r.json()
    assert problem["code"] == "unknown_node"
    assert "node-nowhere" in problem["detail"] and lost in problem["detail"]
    assert sorted(problem["nodes"]) == sorted(["node-nowhere", lost])
    assert counts(catalog) == before


JOB_NAME_RULE = (
    "a job name is 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
)


@pytest.mark.parametrize(
    "name", ["-x", ".x", "a/b", "a" * 129, "sp ace", "ünï", "a%2Fb", "{x}"], ids=lambda n: n[:12]
)
async def test_bad_job_name(client: httpx.AsyncClient, catalog: Engine, name: str) -> None:
    before = counts(catalog)
    r = await client.post(f"/v1/jobs/{name}/checkpoints", json=_valid())
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == PROBLEM
    problem = r.json()
    assert problem["code"] == "invalid_job_name"
    # The rule in words, as the CLI prints it: not the regex.
    assert JOB_NAME_RULE in problem["detail"] and "A-Za-z" not in problem["detail"], problem
    assert len(problem["errors"]) == 1, problem  # once, though route and auth both read it
    assert counts(catalog) == before


async def test_a_bad_job_name_in_a_view_filter_is_refused_in_words(
    client: httpx.AsyncClient,
) -> None:
    for view in ("/v1/failures", "/v1/copies/in-flight", "/v1/overview/jobs"):
        r = await client.get(view, params={"job": "../etc"})
        assert r.status_code == 422, r.text
        problem = r.json()
        assert problem["code"] == "invalid_job_name", problem
        assert problem["detail"] == f"job name '../etc' is not valid: {JOB_NAME_RULE}", problem


async def test_job_name_of_128_chars_is_fine(client: httpx.AsyncClient) -> None:
    name = "j" + uuid.uuid4().hex + "x" * 95
    assert len(name) == 128
    r = await client.post(f"/v1/jobs/{name}/checkpoints", json=_valid())
    assert r.status_code == 201, r.text


async def test_body_that_is_not_json(client: httpx.AsyncClient, catalog: Engine, job: str) -> None:
    before = counts(catalog)
    r = await client.post(
        f"/v1/jobs/{job}/checkpoints",
        content=b'{"step": 1, "shards": [',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422
    assert r.json()["code"] == "invalid_manifest"
    assert counts(catalog) == before


@pytest.fixture
async def small_client(
    settings: Settings, nodes: tuple[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    limited = settings.model_copy(
        update={"max_manifest_bytes": 2000, "max_shards_per_checkpoint": 3}
    )
    async for c in running_client(create_app(limited)):
        yield c


def _big(n: int) -> dict[str, Any]:
    return manifest(1, [shard(f"shard-{i:05d}.bin") for i in range(n)])


async def test_oversize_manifest_by_content_length(
    small_client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    before = counts(catalog)
    r = await small_client.post(f"/v1/jobs/{job}/checkpoints", json=_big(40))
    assert r.status_code == 413
    assert r.headers["content-type"] == PROBLEM
    assert r.json()["code"] == "manifest_too_large"
    assert "2000" in r.json()["detail"]
    assert counts(catalog) == before


async def test_oversize_manifest_streamed_without_length(
    small_client: httpx.AsyncClient, catalog: Engine, job: str
) -> None:
    payload = json.dumps(_big(40)).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(payload), 500):
            yield payload[i : i + 500]

    before = counts(catalog)
    r = await small_client.post(
        f"/v1/jobs/{job}/checkpoints",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert "content-length" not in r.request.headers
    assert r.status_code == 413, r.text
    assert r.json()["code"] == "manifest_too_large"
    assert counts(catalog) == before


async def test_too_many_shards(small_client: httpx.AsyncClient, catalog: Engine, job: str) -> None:
    before = counts(catalog)
    r = await small_client.post(f"/v1/jobs/{job}/checkpoints", json=_big(4))
    assert r.status_code == 413
    assert r.json()["code"] == "manifest_too_large"
    assert "limit is 3" in r.json()["detail"]
    assert counts(catalog) == before
    assert (await small_client.post(f"/v1/jobs/{job}/checkpoints", json=_big(3))).status_code == 201


async def test_the_largest_step_javascript_holds_is_fine_and_one_more_is_not(
    client: httpx.AsyncClient, job: str
) -> None:
    top = 2**53 - 1
    body = {**_valid(), "step": top}
    r = await client.post(f"/v1/jobs/{job}/checkpoints", json=body)
    assert r.status_code == 201, r.text
    assert (await client.get(f"/v1/jobs/{job}/checkpoints/{top}")).json()["step"] == top
    r = await client.get(f"/v1/jobs/{job}/checkpoints/{top + 1}")
    assert r.status_code == 422 and r.json()["code"] == "step_out_of_range", r.text
