"""Every workflow of the shared queue: what the workers register and what recorded histories
must replay against."""

from __future__ import annotations

from workflows.checkpoint_lifecycle import CheckpointLifecycle, CheckpointLifecycleStage
from workflows.peer import PeerRereplicate
from workflows.reconcile import Reconcile
from workflows.repair import CheckpointRepair
from workflows.retention import JobRetention, RetentionSweep
from workflows.scrub import Scrub, ScrubUnitRun, VerifyCheckpoint, VerifyReplicas

WORKFLOWS = (
    CheckpointLifecycle,
    CheckpointLifecycleStage,
    JobRetention,
    RetentionSweep,
    CheckpointRepair,
    Scrub,
    ScrubUnitRun,
    VerifyReplicas,
    VerifyCheckpoint,
    Reconcile,
    PeerRereplicate,
)
