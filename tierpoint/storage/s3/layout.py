"""How an S3 tier names a checkpoint's objects: its key layout.

S3 scales a bucket by partitioning its key space by prefix, and each partitioned prefix takes at
least 3,500 PUT/COPY/POST/DELETE and 5,500 GET/HEAD requests per second. Two layouts:

- `flat`: `<tier prefix><job>/<step>/<path>`, a whole checkpoint under one prefix.
- `spread-N`: `<tier prefix>_<h>/<job>/<step>/<path>`, where `h` is a hash of `<job>/<step>/<path>`
  modulo N in fixed-width hex: a checkpoint's shards fall evenly on N prefixes, which S3 can
  partition apart (N times the request rate of one prefix, once S3 has split them).

The `_` keeps the two apart: a job name starts with a letter or a digit, so no flat key is ever a
spread key (`a/5/3/p` could otherwise be job `a`, step 5 or job `5` under hash `a`).

The layout of a checkpoint's copy is recorded in the catalog when the copy is planned
(`checkpoint_tier.key_layout`) and every reader uses that, never the tier's setting: changing the
setting moves only the checkpoints planned afterwards.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tierpoint.storage.paths import checkpoint_parts, step_dir
from tierpoint.tier_config import KeyLayoutKind, TierKind

if TYPE_CHECKING:
    from collections.abc import Iterable

    from tierpoint.tier_config import TierConfig

# S3 partitions far past this, but reconciliation lists each prefix per job: a bound keeps that
# cost known (and 256 x 3,500 PUT/s is more than any one checkpoint needs).
MAX_PREFIXES = 256
SPREAD_MARK = "_"
_SPREAD_RE = re.compile(r"^spread-([1-9][0-9]*)$")


class UnknownKeyLayout(ValueError):
    """The catalog names a layout this version does not know: never guessed, since a wrong guess
    reads or deletes other keys."""


@dataclass(frozen=True)
class KeyLayout:
    prefixes: int = 1  # 1 = flat

    def __post_init__(self) -> None:
        if not 1 <= self.prefixes <= MAX_PREFIXES:
            raise UnknownKeyLayout(f"a key layout spreads over 1 to {MAX_PREFIXES} prefixes")

    @property
    def name(self) -> str:
        """What the catalog records: `flat` or `spread-N`."""
        return "flat" if self.prefixes == 1 else f"spread-{self.prefixes}"

    @classmethod
    def parse(cls, recorded: str | None) -> KeyLayout:
        """The layout the catalog recorded; None (a copy planned before layouts were recorded) is
        flat, the only layout there was."""
        if recorded is None or recorded == "flat":
            return FLAT
        m = _SPREAD_RE.match(recorded)
        if m is None or not 2 <= int(m.group(1)) <= MAX_PREFIXES:
            raise UnknownKeyLayout(f"unknown S3 key layout {recorded!r}")
        return cls(int(m.group(1)))

    def spread_dir(self, job: str, step: int, rel: str, branch: int = 1) -> str:
        """The first key component of a shard under the tier prefix ('' when flat)."""
        if self.prefixes == 1:
            return ""
        digest = hashlib.sha256(f"{job}/{step_dir(step, branch)}/{rel}".encode()).digest()
        h = int.from_bytes(digest[:8], "big") % self.prefixes
        width = len(f"{self.prefixes - 1:x}")
        return f"{SPREAD_MARK}{h:0{width}x}/"

    def key(self, prefix: str, job: str, step: int, rel: str, branch: int = 1) -> str:
        """The S3 key of a shard, every character as it is (S3 keys are UTF-8 bytes; nothing is
        encoded here, and nothing may decode it later)."""
        return (
            prefix
            + self.spread_dir(job, step, rel, branch)
            + "/".join(checkpoint_parts(job, step, rel, branch))
        )

    def checkpoint_prefixes(
        self, prefix: str, job: str, step: int, paths: Iterable[str], branch: int = 1
    ) -> list[str]:
        """The prefixes under which the shards `paths` of a checkpoint live, each ending in `/`."""
        tail = "/".join(checkpoint_parts(job, step, None, branch)) + "/"
        dirs = {self.spread_dir(job, step, p, branch) for p in paths} if self.prefixes > 1 else {""}
        return sorted(prefix + d + tail for d in dirs)


FLAT = KeyLayout(1)


def is_spread_dir(name: str) -> bool:
    """Whether a first component under a tier's prefix is one of a spread layout's (no job name
    has this shape: they start with a letter or a digit)."""
    return (
        name.startswith(SPREAD_MARK)
        and 1 < len(name) <= 3
        and all(c in "0123456789abcdef" for c in name[1:])
    )


def layout_in_force(tier: TierConfig) -> KeyLayout:
    """The layout the tier's settings ask for, recorded for each checkpoint when its copy there
    is planned (and read back from the catalog from then on)."""
    if tier.kind is not TierKind.S3 or tier.key_layout == KeyLayoutKind.FLAT:
        return FLAT
    return KeyLayout(tier.key_prefixes)


def s3_object(
    tier: TierConfig | None, layout: KeyLayout, job: str, step: int, rel: str, branch: int = 1
) -> tuple[str, str] | tuple[None, None]:
    """(bucket, key) of a shard's copy on `tier` if it is a configured S3 tier, else (None, None):
    what the API hands readers, so that none of them has to take a location string apart.
    `layout` is the one the catalog recorded for this checkpoint's copy on the tier."""
    if tier is None or tier.kind is not TierKind.S3 or not tier.bucket:
        return None, None
    return tier.bucket, layout.key(tier.prefix, job, step, rel, branch)
