"""Which file a shard's copy is: recorded on its replica when the catalog reads it (seal, a copy's
read-back, a scrub), checked by every delete before it removes the file.

A path names whatever was last renamed onto it: after an admin deleted step S, a job that writes S
again puts new files at the old paths, and a delete by path would remove those. A delete must
remove the bytes the catalog verified, and nothing else, so it compares the file it is about to
remove with the identity recorded then:

- the inode number: a new file (written to a temp name and renamed, as copies and DCP do) is
  another inode;
- the size and the modification time in nanoseconds: a file rewritten in place (same inode) has
  a new mtime, and an inode number reused after the old file was unlinked comes with the new
  file's own mtime.

Not the device number: network and FUSE file systems (NFS, Lustre) get an anonymous device number
at each mount, so it changes across a node's reboot while the file does not, and a delete after
it would keep every file. A checkpoint's directory lies on the one file system of its tier root.
Renaming a file changes its ctime (not its mtime), which is why ctime is not part of it either:
a delete renames the file aside before it checks it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_TOKEN = re.compile(r"^v1:([0-9]+):([0-9]+):(-?[0-9]+)$")


@dataclass(frozen=True)
class FileIdentity:
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_ino, st.st_size, st.st_mtime_ns)

    def token(self) -> str:
        """What the catalog stores (`replica.file_identity`)."""
        return f"v1:{self.ino}:{self.size}:{self.mtime_ns}"

    @classmethod
    def parse(cls, token: str) -> FileIdentity | None:
        """The identity a token states; None for a form this version does not know (a delete then
        treats the file as not the recorded one: keeping a file is safe, removing one is not)."""
        m = _TOKEN.match(token)
        return None if m is None else cls(int(m[1]), int(m[2]), int(m[3]))


def identity_token(st: os.stat_result) -> str:
    return FileIdentity.of(st).token()


def is_file(token: str, st: os.stat_result) -> bool:
    """Whether `st` (an lstat) is the regular file the token recorded."""
    recorded = FileIdentity.parse(token)
    return recorded is not None and recorded == FileIdentity.of(st)
