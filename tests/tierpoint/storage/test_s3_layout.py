"""S3 key layouts: flat keys are what they always were, byte for byte; spread keys follow the
documented rule (restated here), never collide with a flat key, and spread a checkpoint's writes
over prefixes that S3 (here the shaping proxy, per partitioned prefix) throttles apart."""

from __future__ import annotations

import hashlib
import io
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.s3_proxy import Shaping, shaping_proxy
from tierpoint.storage.base import ShardRef
from tierpoint.storage.paths import PARTIAL_SUFFIX
from tierpoint.storage.registry import open_store
from tierpoint.storage.s3.layout import (
    FLAT,
    KeyLayout,
    UnknownKeyLayout,
    is_spread_dir,
    layout_in_force,
)
from tierpoint.storage.s3.store import S3Store
from tierpoint.tier_config import NAME_RE, TierConfig, TierKind


def _spread_key(prefix: str, n: int, job: str, step: int, path: str) -> str:
    h = int.from_bytes(hashlib.sha256(f"{job}/{step}/{path}".encode()).digest()[:8], "big") % n
    return f"{prefix}_{h:0{len(f'{n - 1:x}')}x}/{job}/{step}/{path}"


@pytest.mark.parametrize("path", ["a.bin", "rank 0/shard?#%.distcp", "d/é/ü.bin"])
def test_flat_keys_are_the_keys_of_before(path: str) -> None:
    assert FLAT.key("ckpt/", "llama.run-7", 42, path) == f"ckpt/llama.run-7/42/{path}"
    assert FLAT.key("", "j", 0, path) == f"j/0/{path}"
    assert FLAT.checkpoint_prefixes("ckpt/", "j", 3, [path, "x"]) == ["ckpt/j/3/"]
    assert KeyLayout.parse(None) == FLAT == KeyLayout.parse("flat")


@pytest.mark.parametrize("n", [2, 16, 17, 256])
def test_spread_keys_follow_the_rule(n: int) -> None:
    layout = KeyLayout.parse(f"spread-{n}")
    assert layout.name == f"spread-{n}"
    paths = [f"__{r}_0.distcp" for r in range(200)]
    keys = [layout.key("p/", "job", 9, p) for p in paths]
    assert keys == [_spread_key("p/", n, "job", 9, p) for p in paths]
    dirs = {k.split("/")[1] for k in keys}
    assert all(is_spread_dir(d) for d in dirs)
    assert len(dirs) == min(n, len(dirs)) and len(dirs) > 1
    prefixes = layout.checkpoint_prefixes("p/", "job", 9, paths)
    assert prefixes == sorted(f"p/{d}/job/9/" for d in dirs)


def test_no_job_name_looks_like_a_spread_dir() -> None:
    # A flat key starts with the job name; a spread key with `_<hex>`: they never meet.
    assert not NAME_RE.match("_a") and not NAME_RE.match("_00")
    assert not is_spread_dir("a") and not is_spread_dir("_") and not is_spread_dir("_g")


@pytest.mark.parametrize("recorded", ["spread-1", "spread-257", "spread-08", "hashed", ""])
def test_unknown_layouts_are_refused(recorded: str) -> None:
    with pytest.raises(UnknownKeyLayout):
        KeyLayout.parse(recorded)


def test_the_layout_in_force_comes_from_the_s3_tier() -> None:
    s3 = TierConfig(name="s3", kind=TierKind.S3, bucket="b")
    assert layout_in_force(s3) == FLAT
    spread = TierConfig(
        name="s3", kind=TierKind.S3, bucket="b", key_layout="spread", key_prefixes=32
    )
    assert layout_in_force(spread) == KeyLayout(32)
    with pytest.raises(ValueError, match="S3 tiers only"):
        TierConfig(name="l", kind=TierKind.SHARED, root="/x", key_layout="spread")


def test_a_store_without_a_layout_names_no_object(s3_tier: TierConfig) -> None:
    store = open_store(s3_tier, None)
    with pytest.raises(RuntimeError, match="recorded key layout"):
        store.location(ShardRef("j", 1, "a"))


def _slowdowns(s3_tier: TierConfig, layout: KeyLayout, names: list[str], job: str) -> int:
    """Write `names` through the shaping proxy (two PUTs per second per first key segment) with
    eight threads; the proxy's count of requests it refused for their prefix's rate."""
    shaping = Shaping(latency_min=0.0, latency_max=0.0, bandwidth=0, write_rate=2, read_rate=0)
    assert s3_tier.endpoint_url is not None
    with shaping_proxy(s3_tier.endpoint_url, shaping) as proxy:
        tier = s3_tier.model_copy(
            update={"endpoint_url": proxy.endpoint_url, "prefix": "", "max_attempts": 30}
        )
        store = open_store(tier, None, layout)
        assert isinstance(store, S3Store)

        def put(name: str) -> None:
            ref = ShardRef(job, 1, name)
            got = store.write(ref, io.BytesIO(name.encode()), len(name.encode()), None, None)
            assert store.verify(ref, got.size, got.crc32c).ok, name

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, names))
        stats: dict[str, Any] = proxy.stats()
    return int(stats["slowdown_rate"])


def test_spread_keys_meet_fewer_slowdowns(s3_tier: TierConfig) -> None:
    job = "slowdown"  # a fresh bucket per test; this name puts at most 2 shards on a prefix
    names = [f"__{r}_0.distcp" for r in range(16)]
    spread = KeyLayout(64)
    per_dir = Counter(spread.spread_dir(job, 1, n) for n in names)
    assert max(per_dir.values()) == 2, per_dir
    flat = _slowdowns(s3_tier, FLAT, names, job)
    spread_refused = _slowdowns(s3_tier, spread, names, job)
    print(f"SlowDown answers: flat {flat}, spread over 64 prefixes {spread_refused}")
    # 16 PUTs on one prefix at once, 2 allowed per second: most are refused at first. Spread,
    # no prefix gets more than 2 in all: none is.
    assert flat >= 8 and spread_refused == 0, (flat, spread_refused)


_component = st.from_regex(r"[A-Za-z0-9_.-]{1,6}", fullmatch=True).filter(
    lambda c: c not in (".", "..") and not c.endswith(PARTIAL_SUFFIX)
)
_shard = st.tuples(
    st.from_regex(NAME_RE, fullmatch=True).map(lambda j: j[:20]),
    st.integers(0, 10**6),
    st.lists(_component, min_size=1, max_size=3).map("/".join),
)


@given(a=_shard, b=_shard, n=st.integers(2, 256))
def test_a_flat_key_is_never_a_spread_key(
    a: tuple[str, int, str], b: tuple[str, int, str], n: int
) -> None:
    """Two layouts in one bucket (a setting changed) never name one object for two shards."""
    spread = KeyLayout(n)
    assert FLAT.key("p/", *a) != spread.key("p/", *b)
    if a != b:
        assert spread.key("p/", *a) != spread.key("p/", *b)


def test_the_mark_keeps_a_spread_key_from_a_flat_one() -> None:
    key = KeyLayout(16).key("", "5", 3, "p")  # `_<h>/5/3/p`
    first = key.split("/")[0]
    # Unmarked, it would be job `<h>`'s step 5, path `3/p` as well.
    assert FLAT.key("", first.removeprefix("_"), 5, "3/p") != key
    assert first.startswith("_") and is_spread_dir(first)
