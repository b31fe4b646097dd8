"""How long a workflow activation may run before the SDK calls it deadlocked.

The Python SDK fails a workflow task whose activation has not yielded within 2 s, and raises an
exception into the activation's thread at whatever line it reached. Our workflows do no I/O and
nothing long (tests/workflows/test_determinism_rules.py), so what runs past 2 s is a worker whose
process is starved of CPU: a busy machine, a container at its CPU quota, a burst of activity
threads holding the GIL. On such a worker the detector fails tasks of lifecycles that were not
stuck, and each failed task is retried by replaying the history on a machine that is still busy:
the suite's own runs on a two-core machine logged such failures, and a timeline test whose
lifecycles' activations were made to stall six times for 2.6 s ran 20-64 s instead of 10-15. A
real deadlock in a workflow is still caught, later.

The SDK has no option for this (the Go and Java SDKs do); the attribute it reads is set here, and
`tolerate_stalls` refuses to start a worker if an SDK upgrade renamed it rather than silently
going back to 2 s.
"""

from __future__ import annotations

from temporalio.worker import Worker

# Ten times the longest activation measured on a loaded machine (a burst of 1,000 batch
# completions in one lifecycle, about 2 s, before stages of over 250 batches ran in children).
ACTIVATION_DEADLINE_SECONDS = 30


def tolerate_stalls(worker: Worker, seconds: int = ACTIVATION_DEADLINE_SECONDS) -> Worker:
    """`worker`, whose workflow activations are called deadlocked after `seconds`, not 2."""
    workflows = getattr(worker, "_workflow_worker", None)
    if workflows is None:
        return worker  # no workflows on this worker's queue
    if not hasattr(workflows, "_deadlock_timeout_seconds"):
        raise RuntimeError(
            "this temporalio no longer keeps the workflow deadlock timeout where "
            "apps/worker_stalls.py sets it: look for the option that replaced it"
        )
    if workflows._deadlock_timeout_seconds is not None:  # None: the SDK's debug mode, no limit
        workflows._deadlock_timeout_seconds = seconds
    return worker
