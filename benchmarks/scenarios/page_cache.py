"""What a copy off the local tier leaves in the node's page cache, and what a restart right after
it pays: the local tier's `page_cache` setting, both ways, on this machine's disk.

A job saves step 1, then step 2 (each `mib` MiB in 4 files, written and fsynced as DCP's
`FileSystemWriter(sync_files=True)` leaves them: clean, every page cached). Then, per method:

- `no copy` (the baseline): the restart loads step 2 as the save left it, with nothing between;
- `keep_newest` and `drop`: tierpoint copies step 2 to the shared tier (`PosixStore`, the copy's
  own reader and writer), then the restart loads it;
- `from the device`: step 2's pages dropped before the load (what the restart would pay cold).

A load reads every file once through one reused buffer and checks its crc32c against the save's.
Rows: the load's seconds (compared to `no copy`), the copy's seconds (`keep_newest` compared to
`drop`), and, measured with mincore(2) right after the copy, the share of step 2's and of step
1's pages still cached (in %): what the setting costs the trainer's memory.
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks.env import Env
from benchmarks.harness import Method, Outcome, Row, Scenario
from tests.helpers.page_cache import resident, written_back
from tierpoint.storage.base import ShardRef
from tierpoint.storage.checksum import crc32c_update
from tierpoint.storage.posix.page_cache import drop_cache
from tierpoint.storage.posix.store import PosixStore
from tierpoint.tier_config import PageCachePolicy, TierConfig, TierKind

FILES = 4
NODE = "node-0"
JOB = "job"
BUFFER = 8 * 1024 * 1024
NO_COPY = "load, no copy (as the save left it)"
COLD = "load from the device (pages dropped)"


def _label(policy: PageCachePolicy) -> str:
    return f"page_cache = {policy.value}"


class PageCache(Scenario):
    name = "page_cache"
    summary = "a restart's load right after a checkpoint was copied off the local tier"

    def __init__(self, env: Env, mib: int) -> None:
        self.work = env.work / self.name
        self.size = max(1, mib * 1024 * 1024 // FILES)
        self.crcs: dict[tuple[int, str], int] = {}

    def params(self) -> dict[str, Any]:
        return {"bytes per checkpoint": self.size * FILES, "files": FILES}

    def _names(self) -> list[str]:
        return [f"__{i}_0.distcp" for i in range(FILES)]

    def _local(self, policy: PageCachePolicy) -> PosixStore:
        root = str(self.work / "local" / "{node}")
        tier = TierConfig(name="ssd", kind=TierKind.LOCAL, root=root, page_cache=policy)
        return PosixStore(tier, NODE)

    def _path(self, step: int, name: str) -> Path:
        return Path(self._local(PageCachePolicy.DROP).location(ShardRef(JOB, step, name)))

    def prepare(self) -> list[Method]:
        self.work.mkdir(parents=True)
        shared = TierConfig(name="lustre", kind=TierKind.SHARED, root=str(self.work / "shared"))
        self.shared = PosixStore(shared)
        base = f"{NO_COPY}: load"
        nbytes = self.size * FILES
        methods = [
            Method(NO_COPY, self._load_only, (Row(base, "load", nbytes=nbytes),), before=self._save)
        ]
        for policy in (PageCachePolicy.DROP, PageCachePolicy.KEEP_NEWEST):
            label = _label(policy)
            # The copy's own cost, against the copy that dropped what it read (the old way).
            drop = f"{_label(PageCachePolicy.DROP)}: copy"
            rows = (
                Row(f"{label}: load right after the copy", "load", base, nbytes=nbytes),
                Row(f"{label}: copy", "copy", drop if policy is not PageCachePolicy.DROP else None),
                Row(f"{label}: newest checkpoint's pages cached (%)", "newest cached", unit="n"),
                Row(f"{label}: older checkpoint's pages cached (%)", "older cached", unit="n"),
            )
            run = functools.partial(self._copy_then_load, policy)
            methods.append(Method(label, run, rows, before=self._save))
        cold = (Row(f"{COLD}: load", "load", base, nbytes=nbytes),)
        methods.append(Method(COLD, self._load_only, cold, before=self._save_then_drop))
        return methods

    def _save(self) -> None:
        """Untimed: steps 1 and 2 saved afresh, nothing copied yet."""
        shutil.rmtree(self.work / "local", ignore_errors=True)
        shutil.rmtree(self.work / "shared", ignore_errors=True)
        for step in (1, 2):
            for name in self._names():
                data = os.urandom(self.size)
                written_back(self._path(step, name), data)
                self.crcs[(step, name)] = crc32c_update(0, data)

    def _save_then_drop(self) -> None:
        self._save()
        for name in self._names():
            fd = os.open(self._path(2, name), os.O_RDONLY)
            try:
                drop_cache(fd)
            finally:
                os.close(fd)

    def _load(self) -> float:
        """Seconds to read step 2's files, each checked against the save's crc32c."""
        buf = bytearray(BUFFER)
        view = memoryview(buf)
        t0 = time.perf_counter()
        for name in self._names():
            crc = 0
            with open(self._path(2, name), "rb", buffering=0) as f:
                while n := f.readinto(view):
                    crc = crc32c_update(crc, view[:n])
            if crc != self.crcs[(2, name)]:
                raise RuntimeError(f"step 2's {name}: read back other bytes than were saved")
        return time.perf_counter() - t0

    def _load_only(self) -> Outcome:
        return Outcome({"load": self._load()})

    def _copy_then_load(self, policy: PageCachePolicy) -> Outcome:
        local = self._local(policy)
        t0 = time.perf_counter()
        for name in self._names():
            ref = ShardRef(JOB, 2, name)
            with local.open_read(ref) as source:
                self.shared.write(ref, source, self.size, None, None)
        copy = time.perf_counter() - t0
        newest = [resident(self._path(2, n)) for n in self._names()]
        older = [resident(self._path(1, n)) for n in self._names()]
        return Outcome(
            {
                "copy": copy,
                "newest cached": 100 * sum(newest) / len(newest),
                "older cached": 100 * sum(older) / len(older),
                "load": self._load(),
            }
        )

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
