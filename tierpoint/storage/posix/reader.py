"""Reading a POSIX tier's file: throttled, dropping the pages behind the reader."""

from __future__ import annotations

import io
import os

from tierpoint.storage.posix.page_cache import drop_cache
from tierpoint.storage.throttle import TokenBucket

# Readers drop the pages behind them in windows of this size.
DROP_WINDOW = 32 * 1024 * 1024


class PosixReader(io.RawIOBase):
    """Raw reader over a file descriptor: throttled, dropping the pages it has read."""

    def __init__(self, fd: int, limiter: TokenBucket | None = None, *, drop_behind: bool = True):
        super().__init__()
        self._fd = fd
        self._limiter = limiter
        self._drop_behind = drop_behind
        self._pos = os.lseek(fd, 0, os.SEEK_CUR)
        self._dropped = self._pos

    @property
    def drops_behind(self) -> bool:
        """Whether what is read is dropped from the page cache (the tier's `page_cache`)."""
        return self._drop_behind

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        n = os.readv(self._fd, [buffer])
        if self._limiter is not None:
            self._limiter.consume(n)
        self._pos += n
        if self._drop_behind and self._pos - self._dropped >= DROP_WINDOW:
            drop_cache(self._fd, self._dropped, self._pos - self._dropped)
            self._dropped = self._pos
        return n

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._pos = os.lseek(self._fd, offset, whence)
        self._dropped = self._pos
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            try:
                if self._drop_behind and self._pos > self._dropped:
                    drop_cache(self._fd, self._dropped, self._pos - self._dropped)
            finally:
                os.close(self._fd)
        super().close()
