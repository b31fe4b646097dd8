"""Part buffers reused from one upload to the next.

A multipart upload holds at most `concurrency + 1` parts in memory: one being read from the
source while `concurrency` are on their way. Allocating them per object costs a page fault per
4 KiB page and a memset of every byte, per object; the pool hands the same buffers to the next
upload instead. It keeps at most `keep` idle buffers per size, so an idle worker holds at most one
upload's worth of parts, however many uploads ran at once before.
"""

from __future__ import annotations

import threading


class PartBuffers:
    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._idle: dict[int, list[bytearray]] = {}
        self._lock = threading.Lock()

    def take(self, size: int) -> bytearray:
        with self._lock:
            idle = self._idle.get(size)
            if idle:
                return idle.pop()
        return bytearray(size)

    def give(self, buffers: list[bytearray]) -> None:
        with self._lock:
            for buf in buffers:
                idle = self._idle.setdefault(len(buf), [])
                if len(idle) < self._keep:
                    idle.append(buf)

    def idle(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._idle.values())
