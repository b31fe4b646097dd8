"""A placed read of a POSIX copy (a local or shared tier's file) on the process's reader threads:
every byte lands where the placement says and is verified, and the reading is handed to the
threads as one task per thread, each taking the next 4 MiB piece until none is left. A task and a
future per piece cost the loading thread more than the rest of its work on a busy machine (a
1 GiB file of 16 MiB tensors and their biases is some 600 pieces)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from tierpoint_client.hashing import crc32c_hex, update
from tierpoint_client.models import PlanEntry
from tierpoint_client.sources import Mismatch, Pread, Segment
from tierpoint_client.sources.placing import PIECE, READ_THREADS
from tierpoint_client.sources.posix_file import FileSource


class Whole:
    """The reader's memory for the whole file, in one buffer."""

    def __init__(self, size: int) -> None:
        self.buffer = memoryview(bytearray(size))

    def segments(self, pread: Pread) -> list[Segment]:
        return [Segment(0, len(self.buffer), self.buffer)]


def submits_during(read: Callable[[], None]) -> int:
    """How many tasks this thread handed to a thread pool while `read` ran."""
    submit = ThreadPoolExecutor.submit.__code__
    count = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal count
        if event == "call" and frame.f_code is submit:
            count += 1

    sys.setprofile(profile)
    try:
        read()
    finally:
        sys.setprofile(None)
    return count


def written(tmp_path: Path, data: bytes, crc: str | None = None) -> PlanEntry:
    path = tmp_path / "__0_0.distcp"
    path.write_bytes(data)
    crc = crc if crc is not None else crc32c_hex(update(0, data))
    return PlanEntry(path.name, len(data), crc, "ssd", "local", "node-a", str(path))


def test_a_file_of_many_pieces_is_read_by_one_task_per_reader_thread(tmp_path: Path) -> None:
    data = os.urandom(PIECE * 9 + 4321)
    whole = Whole(len(data))

    submits = submits_during(lambda: FileSource(written(tmp_path, data)).read_into(whole, None))

    assert bytes(whole.buffer) == data
    assert submits == READ_THREADS


def test_a_copy_whose_bytes_differ_fails_verification_after_every_thread_stopped(
    tmp_path: Path,
) -> None:
    data = os.urandom(PIECE * 9 + 4321)
    entry = written(tmp_path, data, crc32c_hex(update(0, data[:-1] + b"\0")))
    whole = Whole(len(data))

    with pytest.raises(Mismatch, match="crc32c"):
        FileSource(entry).read_into(whole, None)
    # Every piece landed (the threads were done when the read returned); none differs but the
    # bytes' checksum.
    assert bytes(whole.buffer) == data
