"""POSIX tiers (`local` per node, `shared` such as Lustre): atomic, checksummed, resumable copies.

A write streams through one reused buffer, computes crc32c in the same pass, and goes to a temp
name in the shard's directory (`.<name>.tierpoint-partial`, deterministic so a retry finds it).
Writeback is started chunk by chunk with sync_file_range, which keeps dirty pages bounded, lets
the device write while the next chunk is read, and tells us which prefix is on the device: only
that prefix is reported as resumable. The file is then fsynced, renamed onto the final name and
the directory fsynced (invariant 4).

Verification and sealing read from the device with O_DIRECT, which bypasses the page cache (the
kernel writes a range's dirty pages back before a direct read of it), two reads in flight;
sealing fsyncs first, so that the sealed file is durable too. A file system without O_DIRECT gets
the buffered way instead: fsync (so no dirty page pins the cache), drop the file's pages with
POSIX_FADV_DONTNEED, then read, dropping pages behind the reader.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, cast

from tierpoint.errors import UnsafePath
from tierpoint.storage.base import (
    ByteSource,
    CopyResult,
    DeleteReport,
    ProgressFn,
    RecordedCopy,
    ResumeState,
    ShardRef,
    SourceSizeMismatch,
    VerifyResult,
)
from tierpoint.storage.checksum import (
    crc32c_hex,
    crc32c_of_stream,
    crc32c_update,
    parse_crc32c,
)
from tierpoint.storage.paths import (
    checkpoint_parts,
    is_partial_name,
    partial_name,
    validate_name,
    validate_relative_path,
)
from tierpoint.storage.posix.confined import (
    OPENAT2,
    lstat_entry,
    make_dirs,
    open_dir,
    open_entry,
    open_root,
    opened,
)
from tierpoint.storage.posix.identity import identity_token
from tierpoint.storage.posix.page_cache import drop_cache, start_writeback, wait_writeback
from tierpoint.storage.posix.partial import lock_partial, pwrite_all, refuse_to_replace
from tierpoint.storage.posix.reader import PosixReader
from tierpoint.storage.posix.removal import (
    left_in,
    prune,
    recorded_check,
    remove_recorded,
    unlink_temp,
    written_check,
)
from tierpoint.storage.posix.streams import device_crc32c, prefetched_chunks
from tierpoint.storage.source import check_source_end, position_source
from tierpoint.storage.throttle import TokenBucket
from tierpoint.tier_config import TierConfig, TierKind

DEFAULT_BUFFER_SIZE = 8 * 1024 * 1024


class PosixStore:
    """A `local` or `shared` tier rooted at a directory (for a local tier: this node's root)."""

    def __init__(
        self,
        config: TierConfig,
        node_id: str | None = None,
        *,
        limiter: TokenBucket | None = None,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        openat2: bool = OPENAT2,
    ) -> None:
        """`openat2`: resolve directories with openat2(2) (the default where the kernel has it)
        or one O_NOFOLLOW component at a time; both refuse the same paths."""
        if config.kind is TierKind.S3:
            raise ValueError(f"tier {config.name!r} is an s3 tier, not a POSIX one")
        self.config = config
        self.node_id = node_id
        self.root = Path(os.path.abspath(config.root_for(node_id)))
        if limiter is None and config.read_bandwidth_limit > 0:
            limiter = TokenBucket(config.read_bandwidth_limit)
        self.limiter = limiter
        self.buffer_size = buffer_size
        self.openat2 = openat2

    # -- naming ---------------------------------------------------------------------------

    def location(self, ref: ShardRef) -> str:
        return str(self.root.joinpath(*checkpoint_parts(ref.job, ref.step, ref.path, ref.branch)))

    @contextlib.contextmanager
    def _parent(self, ref: ShardRef, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """(descriptor of the shard's directory, the shard's name in it), the directory reached
        without following a symlink (`confined`); FileNotFoundError if it is not there."""
        parts = checkpoint_parts(ref.job, ref.step, ref.path, ref.branch)
        if create:
            os.makedirs(self.root, exist_ok=True)
        with opened(open_root(str(self.root))) as root_fd:
            reach = make_dirs if create else open_dir
            dir_fd = reach(root_fd, parts[:-1], use_openat2=self.openat2)
        with opened(dir_fd):
            yield dir_fd, parts[-1]

    # -- reading --------------------------------------------------------------------------

    def _open_committed(self, ref: ShardRef) -> int:
        with self._parent(ref) as (dir_fd, name):
            fd = open_entry(dir_fd, name, os.O_RDONLY)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UnsafePath(f"shard {ref.path!r} is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_read(self, ref: ShardRef, offset: int = 0) -> BinaryIO:
        fd = self._open_committed(ref)
        try:
            if offset:
                os.lseek(fd, offset, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        return cast(BinaryIO, PosixReader(fd, self.limiter))

    def _stat(self, ref: ShardRef) -> os.stat_result | None:
        """The committed shard's lstat; None if no regular file is there."""
        try:
            with self._parent(ref) as (dir_fd, name):
                st = lstat_entry(dir_fd, name)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePath(f"shard {ref.path!r} is a symlink; refusing to follow it")
        if not stat.S_ISREG(st.st_mode):
            return None
        return st

    def size(self, ref: ShardRef) -> int | None:
        st = self._stat(ref)
        return None if st is None else st.st_size

    def _device_crc(
        self, ref: ShardRef, progress: Callable[[int], None] | None, *, durable: bool
    ) -> tuple[int, int, str]:
        """(size, crc32c, identity) of the committed shard, read from the device rather than
        the cache; the identity is the file's that was read, taken once the read is done.
        `durable`: fsync it first, also where the direct read would not need it (a seal makes a
        file that someone else wrote durable; a read-back of our own committed write need not
        pay for a journal commit again)."""
        fd = self._open_committed(ref)
        reader = PosixReader(fd, self.limiter)
        with reader:
            if durable:
                with contextlib.suppress(OSError):
                    os.fsync(fd)

            def buffered() -> tuple[int, int]:
                # Dirty pages cannot be dropped: flush them first, then drop the whole file.
                with contextlib.suppress(OSError):
                    os.fsync(fd)
                drop_cache(fd)
                return crc32c_of_stream(reader, self.buffer_size, progress)

            # A direct read writes the range's dirty pages back before it reads the device.
            size, crc = device_crc32c(fd, self.buffer_size, self.limiter, progress, buffered)
            return size, crc, identity_token(os.fstat(fd))

    def checksum(
        self, ref: ShardRef, progress: Callable[[int], None] | None = None
    ) -> VerifyResult:
        try:
            size, crc, identity = self._device_crc(ref, progress, durable=True)
        except FileNotFoundError:
            return VerifyResult(ok=False, size=None, crc32c=None, reason="missing")
        return VerifyResult(ok=True, size=size, crc32c=crc32c_hex(crc), identity=identity)

    def verify(self, ref: ShardRef, size: int, crc32c: str) -> VerifyResult:
        expected = parse_crc32c(crc32c)
        st = self._stat(ref)
        if st is None:
            return VerifyResult(ok=False, size=None, crc32c=None, reason="missing")
        if st.st_size != size:
            reason = f"size {st.st_size} != {size}"
            return VerifyResult(
                ok=False, size=st.st_size, crc32c=None, reason=reason, identity=identity_token(st)
            )
        try:
            read_size, crc, identity = self._device_crc(ref, None, durable=False)
        except FileNotFoundError:
            return VerifyResult(ok=False, size=None, crc32c=None, reason="missing")
        got = crc32c_hex(crc)
        if read_size != size:
            reason = f"size {read_size} != {size}"
            return VerifyResult(
                ok=False, size=read_size, crc32c=got, reason=reason, identity=identity
            )
        # guard: posix-verify-crc
        if crc != expected:
            reason = f"crc32c {got} != {crc32c.lower()}"
            return VerifyResult(
                ok=False, size=read_size, crc32c=got, reason=reason, identity=identity
            )
        return VerifyResult(ok=True, size=read_size, crc32c=got, identity=identity)

    # -- writing --------------------------------------------------------------------------

    def _open_partial(
        self, dir_fd: int, tmp: str, resume: ResumeState | None, size: int
    ) -> tuple[int, int, int]:
        """(fd, offset, crc) of the temp file, locked for this writer; resumed at resume.offset
        when the file holds that much, else truncated to start over."""
        fd = open_entry(dir_fd, tmp, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            lock_partial(fd, dir_fd, tmp)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePath(f"temp file {tmp!r} is not a regular file")
            if resume is not None and 0 < resume.offset <= min(size, st.st_size):
                os.ftruncate(fd, resume.offset)
                return fd, resume.offset, resume.crc
            os.ftruncate(fd, 0)
            return fd, 0, 0
        except BaseException:
            os.close(fd)
            raise

    def write(
        self,
        ref: ShardRef,
        source: ByteSource,
        size: int,
        resume: ResumeState | None,
        progress: ProgressFn | None,
    ) -> CopyResult:
        if size < 0:
            raise ValueError("size must be >= 0")
        with self._parent(ref, create=True) as (dir_fd, name):
            crc, identity = self._write_in(dir_fd, name, ref, source, size, resume, progress)
        if progress is not None:
            progress(ResumeState(offset=size, crc=crc))
        return CopyResult(size=size, crc32c=crc32c_hex(crc), identity=identity)

    def _write_in(
        self,
        dir_fd: int,
        name: str,
        ref: ShardRef,
        source: ByteSource,
        size: int,
        resume: ResumeState | None,
        progress: ProgressFn | None,
    ) -> tuple[int, str]:
        """Write the shard's temp file in its directory and rename it onto `name`; its crc32c,
        and the identity of the file committed (a rename keeps the inode and the mtime)."""
        refuse_to_replace(dir_fd, name, ref)
        tmp = partial_name(name)
        fd, offset, crc = self._open_partial(dir_fd, tmp, resume, size)
        try:
            position_source(source, resume.offset if resume else 0, offset)
            # The chunk written just before: its writeback runs while the next one is read.
            prev_start, prev_len, prev_crc = offset, 0, crc
            for chunk in prefetched_chunks(source, size - offset, self.buffer_size):
                n = len(chunk)
                # Every chunk but the last is a full buffer: a short one is the source's end.
                if offset + n < size and n < self.buffer_size:
                    raise SourceSizeMismatch(
                        f"source of {ref.path!r} ended at {offset + n} bytes, expected {size}"
                    )
                crc = crc32c_update(crc, chunk)
                pwrite_all(fd, chunk, offset)
                if prev_len:
                    # Without sync_file_range the prefix is only in the page cache: enough to
                    # resume after a worker crash; a node crash shortens the file (restart) or
                    # leaves bad bytes that verification catches.
                    if wait_writeback(fd, prev_start, prev_len):
                        drop_cache(fd, prev_start, prev_len)
                    if progress is not None:
                        progress(ResumeState(offset=prev_start + prev_len, crc=prev_crc))
                start_writeback(fd, offset, n)
                offset += n
                prev_start, prev_len, prev_crc = offset - n, n, crc
            check_source_end(ref, source, size)
            os.fsync(fd)
            drop_cache(fd)
            identity = identity_token(os.fstat(fd))
            refuse_to_replace(dir_fd, name, ref)
            # Renamed while still locked: a concurrent writer can never lock the committed file.
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.fsync(dir_fd)
        finally:
            os.close(fd)
        return crc, identity

    # -- removing (`removal`: recorded files of named shards, our temp files, then directories
    # while empty) --------------------------------------------------------------------------

    def delete(self, ref: ShardRef, written: str | None) -> None:
        parts = checkpoint_parts(ref.job, ref.step, ref.path, ref.branch)
        with contextlib.suppress(FileNotFoundError):
            with self._parent(ref) as (dir_fd, name):
                unlink_temp(dir_fd, name)
                if written is not None:
                    remove_recorded(dir_fd, name, written_check(written))
            with opened(open_root(str(self.root))) as root_fd:
                prune(root_fd, [tuple(parts[:-1])], self.openat2)

    def delete_checkpoint(
        self, job: str, step: int, copies: Iterable[RecordedCopy], branch: int = 1
    ) -> DeleteReport:
        base = checkpoint_parts(job, step, None, branch)
        by_dir: dict[tuple[str, ...], list[tuple[str, RecordedCopy]]] = {}
        for copy in copies:
            *sub, name = validate_relative_path(copy.path).split("/")
            by_dir.setdefault((*base, *sub), []).append((name, copy))
        try:
            root_fd = open_root(str(self.root))
        except FileNotFoundError:
            return DeleteReport()
        deleted, kept = 0, []
        with opened(root_fd):
            # guard: expiry-deletes-only-registered
            for parts, named in by_dir.items():
                try:
                    dir_fd = open_dir(root_fd, parts, use_openat2=self.openat2)
                except FileNotFoundError:
                    continue
                with opened(dir_fd):
                    for name, copy in named:
                        unlink_temp(dir_fd, name)
                        removed = remove_recorded(dir_fd, name, recorded_check(copy))
                        deleted += removed.deleted
                        if removed.kept:
                            kept.append(copy.path)
            prune(root_fd, [*by_dir, tuple(base)], self.openat2)
            left = left_in(root_fd, base, self.openat2)
            return DeleteReport(deleted=deleted, left=left, kept=tuple(kept))

    def cleanup_partial(self, ref: ShardRef, resume: ResumeState | None) -> None:
        # A directory we cannot reach without following a symlink holds no temp file of ours.
        with (
            contextlib.suppress(FileNotFoundError, UnsafePath),
            self._parent(ref) as (dir_fd, name),
        ):
            os.unlink(partial_name(name), dir_fd=dir_fd)

    def remove_temp(self, job: str, rel: str) -> bool:
        """Remove an abandoned temp file `<job>/<rel>` that reconcile found; only a regular file
        named like ours is removed. True if one was."""
        *sub, name = [validate_name(job), *rel.split("/")]
        # guard: reconcile-removes-only-our-temp-files
        if not is_partial_name(name) or not sub[1:]:
            return False
        try:
            with opened(open_root(str(self.root))) as root_fd:
                dir_fd = open_dir(root_fd, sub, use_openat2=self.openat2)
            with opened(dir_fd):
                if not stat.S_ISREG(lstat_entry(dir_fd, name).st_mode):
                    return False
                os.unlink(name, dir_fd=dir_fd)
        except (FileNotFoundError, UnsafePath):
            return False
        return True
