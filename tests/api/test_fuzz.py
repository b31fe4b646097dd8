"""Property: whatever the body, registration never answers 5xx, and every refusal is a
problem+json with a stable code."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.api import NODE_A, NODE_B

CODES = {
    "invalid_manifest",
    "invalid_job_name",
    "unsafe_path",
    "unknown_node",
    "manifest_too_large",
    "checkpoint_conflict",
    "step_out_of_range",
    "size_out_of_range",
    "duplicate_key",
    "invalid_text",
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.sampled_from(["\ud800", "a\x00b", "\udfff\ud800", "\u202e"]),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)

paths = st.one_of(
    st.sampled_from(
        ["a", "a/b", "../x", "/etc/passwd", "a/../../b", "./a", "a//b", "a\\b", "", "a\ud800"]
    ),
    st.text(max_size=40),
    st.lists(
        st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=6),
        min_size=1,
        max_size=4,
    ).map("/".join),
)
shards = st.fixed_dictionaries(
    {
        "path": paths,
        "size": st.one_of(
            st.integers(min_value=-5, max_value=2**64), st.text(max_size=3), st.none()
        ),
        "crc32c": st.one_of(st.none(), st.text(alphabet="0123456789abcdefABCDEFxz", max_size=10)),
        "node": st.one_of(st.sampled_from([NODE_A, NODE_B, "node-zz", ""]), st.text(max_size=10)),
    }
)
manifests = st.fixed_dictionaries(
    {
        "step": st.one_of(st.integers(min_value=-3, max_value=2**64), st.text(max_size=3)),
        "shards": st.lists(shards, max_size=5),
        "metadata": json_values,
    }
)
bodies = st.one_of(manifests, json_values)
jobs = st.one_of(
    st.just("fuzz-job"),
    st.text(
        st.characters(exclude_categories=["Cs"]),
        min_size=1,
        max_size=10,
    ),
)


def _body_bytes(body: Any) -> bytes:
    # Lone surrogates and the like are part of what a client can send as JSON text.
    return json.dumps(body).encode()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=bodies, job_suffix=jobs)
async def test_register_never_fails_on_the_server(
    client: httpx.AsyncClient, job: str, body: Any, job_suffix: str
) -> None:
    # Names extend the fixture's job, so that its cleanup finds whatever was registered.
    name = job if job_suffix == "fuzz-job" else job + quote(job_suffix, safe="")
    r = await client.post(
        f"/v1/jobs/{name}/checkpoints",
        content=_body_bytes(body),
        headers={"content-type": "application/json"},
    )
    assert r.status_code < 500, r.text
    if r.status_code in (200, 201):
        assert r.json()["step"] == body["step"]
    else:
        assert r.headers["content-type"] == "application/problem+json", r.text
        # not_found: a name like '..' that the URL itself resolves away.
        assert r.json()["code"] in CODES | {"not_found"}, r.text
