"""What this process's run of a job has loaded, and the branch it saves on. The DCP reader and
writer are separate objects, often made in separate places of a training script: the reader
records here what a load chose (on every rank), and a `TierpointWriter` of the same job takes it
when it is made, so the checkpoint it saves names its parent without the user passing anything.
Taken at construction, it also travels with a writer that DCP pickles into another process (an
`async_save` run by a process, not a thread). A save that registered becomes the parent of the
next one.

A process that loaded nothing records nothing: its writer sends no parent (the server takes the
step before it on the job's timeline, else the job's fork parent) and saves on the job's current
branch."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from tierpoint_client.timeline import CheckpointRef


@dataclass(frozen=True)
class RunPoint:
    # The parent of the run's next save: the checkpoint it loaded, then the one it last saved.
    parent: CheckpointRef | None = None
    # The branch the run saves on: current when it loaded, or the one its rollback made. A
    # rollback by someone else since then refuses the save (`branch_superseded`) rather than
    # mixing this run's state into the new timeline.
    branch: int | None = None


_POINTS: dict[str, RunPoint] = {}
_LOCK = threading.Lock()


def point(job: str) -> RunPoint:
    with _LOCK:
        return _POINTS.get(job, RunPoint())


def loaded(job: str, ref: CheckpointRef, branch: int | None) -> None:
    with _LOCK:
        _POINTS[job] = RunPoint(ref, branch)


def saved(job: str, ref: CheckpointRef, branch: int | None) -> None:
    with _LOCK:
        _POINTS[job] = RunPoint(ref, branch)
