"""What the coordinator asks the API once and hands every other rank through torch.distributed's
key-value store (the one the ranks rendezvoused through), so that what a trainer's ranks ask of
`tierpoint://` costs the API the same at any world size: a restore's start (its lease and every
copy of every file), and the catalog's answers to a resume's probes.

SPMD trainers make the same calls on every rank (torchtitan's resume: whether the folder exists,
its listing, two probes per step folder; DCP's load: every file of the step opened on every rank).
The n-th time a process asks a question of the catalog, it gets the answer the coordinator got the
n-th time it asked the same question: every rank of the job then sees the same steps and resumes
from the same one, even if a step becomes restorable meanwhile. The coordinator itself always
asks the API. A rank that asks what the coordinator does not (it waits SHARE_WAIT for the answer)
or whose coordinator failed to answer asks the API itself: a cost, never a different answer than
a rank asking alone would get.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from tierpoint_client.fs._writes import distributed

T = TypeVar("T")

_PREFIX = "tierpoint-fs-shared"
# How long a rank waits for the coordinator's answer before it asks the API itself.
SHARE_WAIT = timedelta(seconds=60)
_FAILED = b"failed"

_lock = threading.Lock()
_asked: dict[str, int] = {}


def once(question: str, ask: Callable[[], T]) -> tuple[T, bool]:
    """`ask()` answered once for the job's ranks: on the coordinator (rank 0), or in a process
    without torch.distributed, by asking; on every other rank, by the coordinator's answer to its
    own same-numbered `question`. With whether this process asked (what the answer holds, a
    restore's lease, is then its own)."""
    dist = distributed()
    if dist is None:
        return ask(), True
    with _lock:
        n = _asked[question] = _asked.get(question, 0) + 1
    key = f"{_PREFIX}/{question}/{n}"
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 0:
        try:
            answer = ask()
        except BaseException:
            store.set(key, _FAILED)  # the other ranks ask for themselves, without waiting
            raise
        store.set(key, pickle.dumps(answer))
        return answer, True
    try:
        store.wait([key], SHARE_WAIT)
    except RuntimeError:  # timed out (torch's DistStoreError is one)
        return ask(), True
    raw = store.get(key)
    if raw == _FAILED:
        return ask(), True
    # Written by the coordinator of this job, into the store its ranks rendezvoused through.
    theirs: T = pickle.loads(raw)
    return theirs, False
