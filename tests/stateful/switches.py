"""How long the stateful test runs, and the checks of known bugs it holds back until their fixes
are merged.

Each `CHECK_*` switch guards one check that a known bug (found when the store was attacked; its
fix lands on another branch) makes fail on nearly every run. Off, the machine steps around that
one bug so it can keep looking for others; on, the check is made. Turn one on for a run with
`TIERPOINT_STATEFUL_CHECKS=CHECK_PIN_DURING_EXPIRY,...` (or `all`), and flip its default to True
once the fix is in.
"""

from __future__ import annotations

import os


def _wanted() -> set[str]:
    return {s.strip() for s in os.environ.get("TIERPOINT_STATEFUL_CHECKS", "").split(",") if s}


_ON = _wanted()


def _switch(name: str, default: bool) -> bool:
    return default or name in _ON or "all" in _ON


# Expiring a local copy deletes the whole step directory, unregistered files with it. Off: a
# missing unregistered file is tolerated in the directory of a copy that was expired, only there.
CHECK_EXPIRY_SPARES_UNREGISTERED = _switch("CHECK_EXPIRY_SPARES_UNREGISTERED", False)
# The client parses an S3 location as a URL: a key with `?`, `#`, ... is cut. Off: a restore from
# S3 of such a checkpoint may fail (never with wrong bytes accepted).
CHECK_ODD_S3_KEYS = _switch("CHECK_ODD_S3_KEYS", False)
# A pin accepted while a copy is `expiring` is not honoured. Off: a pin answered while a tier is
# expiring is not counted as protecting that tier.
CHECK_PIN_DURING_EXPIRY = _switch("CHECK_PIN_DURING_EXPIRY", False)
# A copy that finds its source corrupt quarantines the source tier instead of repairing it. Off: a
# tier quarantined by the lifecycle (not by the test) is tolerated.
CHECK_SOURCE_DAMAGE_REPAIRED = _switch("CHECK_SOURCE_DAMAGE_REPAIRED", False)
# Bodies are validated before the token is checked (422 before 401/403). Off: forbidden requests
# carry well-formed bodies.
CHECK_AUTH_BEFORE_VALIDATION = _switch("CHECK_AUTH_BEFORE_VALIDATION", False)
# A symlinked shard reads a file outside its step directory. Off: such a registration may be
# accepted; its lifecycle is still watched.
CHECK_SYMLINK_CONFINED = _switch("CHECK_SYMLINK_CONFINED", False)
# NUL characters in a corrupt-copy report reach Postgres (500). Off: not sent.
CHECK_NUL_REFUSED = _switch("CHECK_NUL_REFUSED", False)
# Paths `a` and `a/b` in one manifest, duplicate JSON keys: accepted. Off: not sent.
CHECK_MANIFEST_HOLES = _switch("CHECK_MANIFEST_HOLES", False)


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


# CI: a fixed, derandomized sample. A longer run: TIERPOINT_STATEFUL_EXAMPLES=200 (and a seed to
# explore other sequences: TIERPOINT_STATEFUL_SEED=N, which turns derandomization off).
EXAMPLES = _int("TIERPOINT_STATEFUL_EXAMPLES", 10)
STEPS = _int("TIERPOINT_STATEFUL_STEPS", 12)
SEED = os.environ.get("TIERPOINT_STATEFUL_SEED")
# Shrinking a failure re-runs examples of tens of seconds each: TIERPOINT_STATEFUL_SHRINK=0 reports
# the first failing sequence as found.
SHRINK = os.environ.get("TIERPOINT_STATEFUL_SHRINK", "1") != "0"
