"""A trainer that forks (a DataLoader's workers, a multiprocessing pool) after reading: the child
reads through every source on connections and threads of its own, even when one of the parent's
reader threads was inside the client's bookkeeping at the moment of the fork, and the parent
reads on after it with its own. A child on its parent's keep-alive socket interleaves its
requests with the parent's; one on its parent's pool waits forever for threads it does not have.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from tierpoint_client import PlanEntry, TierInfo, build_manifest
from tierpoint_client import s3 as client_s3
from tierpoint_client.hashing import CHUNK_SIZE
from tierpoint_client.peer import PEERS
from tierpoint_client.restore import restore_plan
from tierpoint_client.sources import Sources, placing
from tierpoint_client.sources.placing import PIECE
from tierpoint_client.sources.posix_file import FileSource

from tests.client.test_placed_read_tasks import Whole, written
from tests.client.test_restore_plan import _entry, _files_under, s3_objects
from tests.helpers.client import QuietFiles, Stack, file_server, read_tree, write_shards
from tests.helpers.s3_proxy import Shaping, ShapingProxy, shaping_proxy
from tests.helpers.services import Services

# Each test forks a child of the pytest process.
pytestmark = pytest.mark.full_stack

T = TypeVar("T")
MiB = 1024 * 1024
_FORK = multiprocessing.get_context("fork")
# A child that has not answered by then hangs: its reads take well under a second.
HUNG = 120.0
# How long the lifecycle may take to make a checkpoint restorable on S3: a hang guard only.
WAIT = 300.0


def in_child(work: Callable[[], T]) -> T:
    """`work()` in a child forked from this process, its result sent back over a pipe. A child
    that hangs is killed and fails the test."""
    answer, send = _FORK.Pipe(duplex=False)

    def run() -> None:
        try:
            send.send(("ok", work()))
        except BaseException as e:  # reported to the parent, which fails the test with it
            send.send(("error", repr(e)))

    child = _FORK.Process(target=run, daemon=True)
    child.start()
    send.close()
    try:
        if not answer.poll(HUNG):
            pytest.fail(f"the forked child hung: no answer in {HUNG:.0f} s")
        status, value = answer.recv()
    finally:
        child.kill()
        child.join()
    if status != "ok":
        pytest.fail(f"the forked child failed: {value}")
    result: T = value
    return result


@contextlib.contextmanager
def inside(*locks: Any) -> Iterator[None]:
    """Another thread of this process holds `locks` until the block ends, as a reader thread
    holds the client's for an instant at each request: a fork in the block copies them held."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with contextlib.ExitStack() as held:
            for lock in locks:
                held.enter_context(lock)
            taken.set()
            done.wait()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    taken.wait()
    try:
        yield
    finally:
        done.set()
        thread.join()


def test_a_forked_child_reads_on_reader_threads_of_its_own(tmp_path: Path) -> None:
    """The parent's reader threads sat idle at the fork: a child handed its parent's pool would
    wait for them forever."""
    data = os.urandom(PIECE * 9 + 4321)
    entry = written(tmp_path, data)

    def read() -> bytes:
        whole = Whole(len(data))
        FileSource(entry).read_into(whole, None)
        return bytes(whole.buffer)

    assert read() == data
    with inside(placing._pools_lock):
        assert in_child(read) == data
    assert read() == data


class _Seen(QuietFiles):
    """An HTTP/1.1 data endpoint (keep-alive) that notes the connection each request came on."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, int]] = []

    def do_GET(self) -> None:
        _Seen.seen.append((self.path, self.client_address[1]))
        super().do_GET()


def _peer_entry(path: str, data: bytes, url: str) -> PlanEntry:
    return dataclasses.replace(_entry(path, data, url, kind="peer"), tier="peer", url=url)


@contextlib.contextmanager
def _copies(tmp_path: Path, services: Services) -> Iterator[_Copies]:
    """A peer copy on an HTTP/1.1 data endpoint and an S3 copy behind a front that keeps
    connections, as S3 does (moto closes each)."""
    peer_data, s3_data = os.urandom(3 * MiB + 5), os.urandom(5 * MiB + 7)
    served = tmp_path / "served"
    served.mkdir()
    (served / "p.bin").write_bytes(peer_data)
    objects = s3_objects(services, {"o.bin": s3_data}, "")
    keeps = Shaping(0.0, 0.0, bandwidth=0, write_rate=0, read_rate=0, keep_alive=True)
    _Seen.seen = []
    with file_server(served, _Seen) as url, shaping_proxy(services.s3_endpoint_url, keeps) as front:
        s3 = dataclasses.replace(objects.tiers["s3"], endpoint_url=front.endpoint_url)
        yield _Copies(
            tmp_path,
            _peer_entry("p.bin", peer_data, f"{url}/p.bin"),
            objects.plan[0],
            {"s3": s3},
            {"p.bin": peer_data, "o.bin": s3_data},
            front,
        )


@dataclasses.dataclass(frozen=True)
class _Copies:
    tmp_path: Path
    peer: PlanEntry
    s3: PlanEntry
    tiers: dict[str, TierInfo]
    data: dict[str, bytes]
    front: ShapingProxy

    def restore(self, dest: str) -> dict[str, bytes]:
        restore_plan([self.peer, self.s3], self.tmp_path / dest, self.tiers, workers=2)
        return _files_under(self.tmp_path / dest)

    def opened(self, run: Callable[[], T]) -> tuple[T, int]:
        """What `run()` gave, and how many connections to S3 it opened."""
        before = int(self.front.stats()["connections"])
        got = run()
        return got, int(self.front.stats()["connections"]) - before - 1  # less the stats' own


def test_a_forked_child_reads_peer_and_s3_copies_on_connections_of_its_own(
    tmp_path: Path, services: Services
) -> None:
    """The parent keeps a connection to the data endpoint and to S3, and its reader still holds
    the sources it opened copies with when the trainer forks (as a DCP load keeps them). The
    child's requests come on connections of its own, its bytes are the files'; the parent reads
    on after it."""
    with _copies(tmp_path, services) as copies:
        sources = Sources(copies.tiers)

        def read_s3() -> bytes:
            return b"".join(bytes(c) for c in sources.open(copies.s3).chunks(CHUNK_SIZE))

        assert copies.restore("parent") == copies.data
        assert read_s3() == copies.data["o.bin"]
        parents = {port for _, port in _Seen.seen}

        (child_s3, child_opened), child_restored = in_child(
            lambda: (copies.opened(read_s3), copies.restore("child"))
        )
        assert child_s3 == copies.data["o.bin"]
        assert child_opened >= 1, "the child's S3 read came on its parent's connection"
        assert child_restored == copies.data
        assert {port for _, port in _Seen.seen} - parents, (
            "the child's peer read came on its parent's connection"
        )

        assert read_s3() == copies.data["o.bin"]
        assert copies.restore("parent-again") == copies.data


def test_a_fork_while_a_reader_thread_holds_the_clients_locks_leaves_the_child_reading(
    tmp_path: Path, services: Services
) -> None:
    """A fork copies a lock another thread holds as held, and no thread of the child ever
    releases it: the child must not wait on its parent's locks."""
    with _copies(tmp_path, services) as copies:
        assert copies.restore("parent") == copies.data
        with inside(PEERS._lock, client_s3._S3_CLIENTS_LOCK, placing._pools_lock):
            assert in_child(lambda: copies.restore("child")) == copies.data
        assert copies.restore("parent-again") == copies.data


async def test_a_forked_child_restores_a_checkpoint_through_the_api(
    stack: Stack, tmp_path: Path
) -> None:
    """The trainer's `Client`, made and used before the fork: the child asks the API for the
    plan and a lease and restores from S3 and the shared tier; the parent restores on after."""
    client, node = stack.client, stack.nodes[0]
    job = f"fork-{uuid.uuid4().hex[:10]}"
    local = stack.local_dir(node, job, 1)
    shards = write_shards(local, {"a.bin": 3 * MiB + 1, "sub/b.bin": 1000})
    await asyncio.to_thread(client.register_manifest, job, 1, build_manifest(local, node))
    await asyncio.to_thread(client.wait_restorable, job, 1, "s3", WAIT, 0.2)

    def restore(dest: str, tier: str) -> dict[str, bytes]:
        result = client.restore(job, tmp_path / dest, tier=tier, workers=2)
        assert (result.job, result.step, result.tiers_used) == (job, 1, {tier: len(shards)})
        return read_tree(tmp_path / dest)

    def scenario() -> None:
        assert restore("parent", "s3") == shards
        child = in_child(lambda: (restore("child-s3", "s3"), restore("child-lustre", "lustre")))
        assert child == (shards, shards)
        assert restore("parent-again", "s3") == shards

    await asyncio.to_thread(scenario)
