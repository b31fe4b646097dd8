from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest

from tierpoint.storage.base import ShardRef
from tierpoint.storage.posix.store import PosixStore
from tierpoint.storage.registry import open_store, read_limiter
from tierpoint.storage.throttle import TokenBucket
from tierpoint.tier_config import TierConfig, TierKind


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept = 0.0
        self.lock = threading.Lock()

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        with self.lock:
            self.slept += s


def test_bucket_lets_a_burst_through_then_charges_the_rate() -> None:
    t = FakeTime()
    bucket = TokenBucket(100, burst=100, clock=t.clock, sleep=t.sleep)
    bucket.consume(100)
    assert t.slept == 0
    bucket.consume(50)
    assert t.slept == pytest.approx(0.5)
    t.now += 10  # refills the debt, and then up to the burst only
    bucket.consume(100)
    assert t.slept == pytest.approx(0.5)
    bucket.consume(200)
    assert t.slept == pytest.approx(0.5 + 2.0)


def test_zero_rate_is_off() -> None:
    t = FakeTime()
    bucket = TokenBucket(0, clock=t.clock, sleep=t.sleep)
    bucket.consume(10**12)
    assert t.slept == 0 and not bucket.enabled


def test_concurrent_consumers_share_one_rate() -> None:
    t = FakeTime()
    bucket = TokenBucket(1000, burst=1000, clock=t.clock, sleep=t.sleep)
    threads = [threading.Thread(target=bucket.consume, args=(1000,)) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    # 8000 bytes at 1000 B/s with 1000 of burst: the k-th waiter waits k seconds.
    assert t.slept == pytest.approx(sum(range(1, 8)))


def test_posix_reads_go_through_the_limiter(tmp_path: Path) -> None:
    t = FakeTime()
    bucket = TokenBucket(1 << 20, burst=1 << 20, clock=t.clock, sleep=t.sleep)
    tier = TierConfig(name="ssd", kind=TierKind.LOCAL, root=str(tmp_path / "{node}"))
    store = PosixStore(tier, "n1", limiter=bucket, buffer_size=1 << 20)
    ref = ShardRef("job", 1, "a")
    data = b"z" * (5 << 20)
    store.write(ref, io.BytesIO(data), len(data), None, None)
    with store.open_read(ref) as f:
        assert f.read() == data
    # 5 MiB at 1 MiB/s with a 1 MiB burst: at least 4 s of waiting were imposed.
    assert t.slept >= 4.0
    before = t.slept
    assert store.checksum(ref).ok
    assert t.slept > before


def test_registry_shares_one_limiter_per_tier_and_node(tmp_path: Path) -> None:
    tier = TierConfig(
        name="ssd", kind=TierKind.LOCAL, root=str(tmp_path / "{node}"), read_bandwidth_limit=10**8
    )
    a = open_store(tier, "n1")
    b = open_store(tier, "n1")
    assert isinstance(a, PosixStore) and isinstance(b, PosixStore)
    assert a.limiter is not None and a.limiter is b.limiter is read_limiter(tier, "n1")
    assert read_limiter(tier, "n2") is not a.limiter
    off = TierConfig(name="ram", kind=TierKind.LOCAL, root=str(tmp_path / "{node}"))
    assert read_limiter(off, "n1") is None


class PassingTime(FakeTime):
    """A clock that a sleep moves on, so each wait is only the debt of its own read."""

    def sleep(self, s: float) -> None:
        with self.lock:
            self.slept += s
            self.now += s


def test_read_back_is_charged_for_the_file_not_its_buffers(tmp_path: Path) -> None:
    """The read-back keeps whole buffers in flight and is charged per read before issuing it: no
    more than the file holds, so a small shard is not billed a whole buffer."""
    t = PassingTime()
    bucket = TokenBucket(1 << 20, burst=1, clock=t.clock, sleep=t.sleep)
    tier = TierConfig(name="lustre", kind=TierKind.SHARED, root=str(tmp_path))
    store = PosixStore(tier, limiter=bucket, buffer_size=8 << 20)
    small, big = ShardRef("job", 1, "small"), ShardRef("job", 1, "big")
    crc = store.write(small, io.BytesIO(b"x" * 1024), 1024, None, None).crc32c
    assert store.verify(small, 1024, crc).ok
    assert t.slept == pytest.approx(1024 / (1 << 20), abs=1e-5)
    data = b"y" * (20 << 20)
    crc = store.write(big, io.BytesIO(data), len(data), None, None).crc32c
    before = t.slept
    assert store.verify(big, len(data), crc).ok
    assert t.slept - before == pytest.approx(20.0, abs=1e-3)
