"""A node's staging area of a coded peer tier: the stripes its encoder cut from the node's own
files, kept until their holders have pulled them.

Stripe i of shard P of a checkpoint lies at `<tier root>/.tierpoint-staging/<i>/<job>/<step>/P`:
each index's directory is the root of a `PosixStore`, so every name in the area is a shard name
under a root, reached without following a symlink, read and deleted as any tier's shard is (a
delete removes only the stripe it is named, and only while it holds the recorded bytes). The
area's name starts with a dot, which no job name does, so it never meets a job's directory.

A file's k+m stripes are cut in one pass over the file, written under our temp names (locked for
this writer alone) and renamed onto their names only once the file's bytes read were the
registered size and crc32c: a stripe is never staged from bytes the catalog did not verify.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

from tierpoint_client.erasure import Code
from tierpoint_client.erasure.stripes import StripeInfo, encode

from tierpoint.errors import UnsafePath
from tierpoint.storage.base import ChecksumMismatch, ShardRef, SourceSizeMismatch
from tierpoint.storage.checksum import crc32c_hex, crc32c_update
from tierpoint.storage.paths import checkpoint_parts, partial_name
from tierpoint.storage.posix.confined import make_dirs, open_entry, open_root, opened
from tierpoint.storage.posix.partial import lock_partial, refuse_to_replace
from tierpoint.storage.posix.store import PosixStore
from tierpoint.tier_config import TierConfig

STAGING_DIR = ".tierpoint-staging"


class _Hashing:
    """The file's bytes as the encoder reads them, their crc32c and count taken in the same
    pass."""

    def __init__(self, raw: BinaryIO, progress: Callable[[int], None] | None) -> None:
        self.raw = raw
        self.progress = progress
        self.crc = 0
        self.read_bytes = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.crc = crc32c_update(self.crc, data)
        self.read_bytes += len(data)
        if self.progress is not None:
            self.progress(self.read_bytes)
        return data


@dataclass
class _Temp:
    dir_fd: int
    fd: int
    tmp: str
    name: str


class StripeStaging:
    def __init__(self, tier: TierConfig, node: str) -> None:
        self.tier = tier
        self.node = node
        self.root = Path(os.path.abspath(tier.root_for(node))) / STAGING_DIR

    def store(self, index: int) -> PosixStore:
        """The store of the area's stripes of index `index` (open_read, verify, delete...)."""
        root = str(self.root / str(index))
        return PosixStore(self.tier.model_copy(update={"root": root}), self.node)

    def holder_store(self) -> PosixStore:
        """The node's store of the tier itself: the stripes it holds for other nodes."""
        return PosixStore(self.tier, self.node)

    def size(self, index: int, ref: ShardRef) -> int | None:
        return self.store(index).size(ref)

    def cut(
        self,
        code: Code,
        ref: ShardRef,
        src: BinaryIO,
        size: int,
        crc32c: str,
        progress: Callable[[int], None] | None = None,
    ) -> list[StripeInfo]:
        """Cut the file `src` (the shard `ref`, registered as `size` bytes and `crc32c`) into its
        k+m stripes, each committed atomically under its name; each stripe's size and crc32c.
        A file that is not the registered bytes stages nothing: `SourceSizeMismatch` or
        `ChecksumMismatch`. `progress` hears the bytes read so far as the pass goes."""
        reader = _Hashing(src, progress)
        with self._temps(code, ref) as temps:
            with contextlib.ExitStack() as stack:
                # Buffered writers over duplicates of the locked descriptors, flushed on close.
                sinks = [stack.enter_context(os.fdopen(os.dup(t.fd), "wb")) for t in temps]
                try:
                    infos = encode(code, cast(BinaryIO, reader), size, sinks)
                except ValueError as exc:
                    raise SourceSizeMismatch(f"{ref.path}: {exc}") from None
            if reader.read(1):
                raise SourceSizeMismatch(f"{ref.path}: the file holds more than {size} bytes")
            # guard: stripes-staged-only-from-registered-bytes
            if crc32c_hex(reader.crc) != crc32c:
                raise ChecksumMismatch(
                    f"{ref.path}: read crc32c {crc32c_hex(reader.crc)}, registered {crc32c}"
                )
            for t in temps:
                os.fsync(t.fd)
            for t in temps:
                refuse_to_replace(t.dir_fd, t.name, ref)
                os.rename(t.tmp, t.name, src_dir_fd=t.dir_fd, dst_dir_fd=t.dir_fd)
                os.fsync(t.dir_fd)
        return infos

    @contextlib.contextmanager
    def _temps(self, code: Code, ref: ShardRef) -> Iterator[list[_Temp]]:
        """A locked temp file beside each stripe's name; every one left is removed on the way
        out (a renamed one is no longer there)."""
        parts = checkpoint_parts(ref.job, ref.step, ref.path, ref.branch)
        temps: list[_Temp] = []
        try:
            for index in range(code.width):
                root = self.root / str(index)
                os.makedirs(root, exist_ok=True)
                with opened(open_root(str(root))) as root_fd:
                    dir_fd = make_dirs(root_fd, parts[:-1])
                tmp = partial_name(parts[-1])
                try:
                    fd = open_entry(dir_fd, tmp, os.O_WRONLY | os.O_CREAT, 0o644)
                except BaseException:
                    os.close(dir_fd)
                    raise
                temps.append(_Temp(dir_fd, fd, tmp, parts[-1]))
                lock_partial(fd, dir_fd, tmp)
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise UnsafePath(f"temp file {tmp!r} is not a regular file")
                os.ftruncate(fd, 0)
            yield temps
        finally:
            for t in temps:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(t.tmp, dir_fd=t.dir_fd)
                os.close(t.fd)
                os.close(t.dir_fd)
