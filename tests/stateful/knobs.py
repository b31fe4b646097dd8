"""How long the stateful test runs: every check is always made; only the run's length, its seed
and shrinking are chosen here (environment variables, for a longer or a different run)."""

from __future__ import annotations

import os


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


# CI: a fixed, derandomized sample. A longer run: TIERPOINT_STATEFUL_EXAMPLES=200 (and a seed to
# explore other sequences: TIERPOINT_STATEFUL_SEED=N, which turns derandomization off). Fewer,
# longer examples than before the peer tier's rules (15 of 12 steps): an example of 12 steps
# rarely reached a holder killed mid-restore or a truncation, an example's fixed cost (a job, its
# settles, its cleanup) is paid fewer times, and 8 of 16 take about as many steps as the 15 of 12
# did (docs/reliability.md has the runs' times).
EXAMPLES = _int("TIERPOINT_STATEFUL_EXAMPLES", 8)
STEPS = _int("TIERPOINT_STATEFUL_STEPS", 16)
# The timeline's machine (timeline.py): 5 examples of up to 16 steps made 8 rollbacks, 27 refused
# ones of every kind, 3 steps saved again, 7 verdicts and a fork in 113 s on a loaded machine.
TIMELINE_EXAMPLES = _int("TIERPOINT_STATEFUL_TIMELINE_EXAMPLES", 5)
TIMELINE_STEPS = _int("TIERPOINT_STATEFUL_TIMELINE_STEPS", 16)
SEED = os.environ.get("TIERPOINT_STATEFUL_SEED")
# Shrinking a failure re-runs examples of tens of seconds each: TIERPOINT_STATEFUL_SHRINK=0 reports
# the first failing sequence as found.
SHRINK = os.environ.get("TIERPOINT_STATEFUL_SHRINK", "1") != "0"
