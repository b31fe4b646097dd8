"""What a copy off a POSIX tier leaves in the node's page cache, per the tier's `page_cache`
setting, checked with mincore(2) (which pages the kernel holds), never with timings.

The case a user meets: a job saves step 2 (its files cached, as the writer leaves them), tierpoint
copies it to the shared tier, and the job crashes and restarts right after: with `keep_newest`
(the default) the restart finds step 2's files in memory, and step 1's pages, which no restart
reads next, are gone; with `drop` the copy leaves nothing of either behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.page_cache import resident, written_back
from tests.helpers.storage import MiB, random_bytes
from tierpoint.storage.base import ShardRef
from tierpoint.storage.posix.store import PosixStore
from tierpoint.tier_config import PageCachePolicy, TierConfig, TierKind

NODE = "node-a"
FILE = "model/__0_0.distcp"
SIZE = 4 * MiB


def _stores(tmp_path: Path, policy: PageCachePolicy | None) -> tuple[PosixStore, PosixStore]:
    options = {} if policy is None else {"page_cache": policy}
    local = TierConfig(
        name="ssd", kind=TierKind.LOCAL, root=str(tmp_path / "nodes" / "{node}"), **options
    )
    shared = TierConfig(name="lustre", kind=TierKind.SHARED, root=str(tmp_path / "lustre"))
    return PosixStore(local, NODE), PosixStore(shared)


def _saved(local: PosixStore, step: int) -> Path:
    """Step `step` of the job saved on the node's local tier, cached as the save left it."""
    path = Path(local.location(ShardRef("job", step, FILE)))
    written_back(path, random_bytes(SIZE))
    assert resident(path) == 1.0  # the premise: the save's pages are all cached
    return path


def _copy(local: PosixStore, shared: PosixStore, step: int) -> None:
    ref = ShardRef("job", step, FILE)
    with local.open_read(ref) as source:
        shared.write(ref, source, SIZE, None, None)


@pytest.mark.parametrize("policy", [None, PageCachePolicy.KEEP_NEWEST])
def test_keep_newest_leaves_the_copied_checkpoint_cached_and_drops_older_ones(
    tmp_path: Path, policy: PageCachePolicy | None
) -> None:
    local, shared = _stores(tmp_path, policy)
    assert local.config.page_cache is PageCachePolicy.KEEP_NEWEST  # the default
    older, newest = _saved(local, 1), _saved(local, 2)
    _copy(local, shared, 2)
    assert resident(newest) == 1.0
    assert resident(older) == 0.0
    # What was copied is the newest step's bytes, read from the cache or not.
    assert Path(shared.location(ShardRef("job", 2, FILE))).read_bytes() == newest.read_bytes()


def test_drop_leaves_nothing_of_the_copied_file_cached(tmp_path: Path) -> None:
    local, shared = _stores(tmp_path, PageCachePolicy.DROP)
    older, newest = _saved(local, 1), _saved(local, 2)
    _copy(local, shared, 2)
    assert resident(newest) == 0.0
    # Not this copy's business: the older step's pages stay as they were.
    assert resident(older) == 1.0


def test_keep_newest_drops_only_regular_files_of_older_steps_inside_the_job(
    tmp_path: Path,
) -> None:
    """What the older steps hold is the job's to write: a FIFO at the file's name must not stall
    the copy, a symlink must not be followed out of the tier, newer steps and other jobs are not
    touched."""
    local, shared = _stores(tmp_path, PageCachePolicy.KEEP_NEWEST)
    newest = _saved(local, 5)
    later = _saved(local, 7)
    other_job = Path(local.location(ShardRef("other", 1, FILE)))
    written_back(other_job, random_bytes(SIZE))
    outside = tmp_path / "outside.bin"
    written_back(outside, random_bytes(SIZE))
    fifo = Path(local.location(ShardRef("job", 3, FILE)))
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    link = Path(local.location(ShardRef("job", 4, FILE)))
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    (Path(local.location(ShardRef("job", 2, "x"))).parent / "model").mkdir(parents=True)

    _copy(local, shared, 5)
    assert resident(newest) == 1.0
    assert resident(later) == 1.0
    assert resident(other_job) == 1.0
    assert resident(outside) == 1.0
