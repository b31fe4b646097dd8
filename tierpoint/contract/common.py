"""Task queues, failure types and the activity options both workflows use."""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum

from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

SHARED_TASK_QUEUE = "tierpoint.shared"


def node_task_queue(node_id: str) -> str:
    """The queue served only by the worker on `node_id`: the one process that can read its local
    tier."""
    return f"tierpoint.node.{node_id}"


class FailureType(StrEnum):
    """`ApplicationError.type`s that activities raise for input that can never work: they are not
    retried. The values appear in recorded histories: never rename one."""

    UNSAFE_PATH = "UnsafePath"
    UNKNOWN_TIER = "UnknownTier"
    WRONG_NODE = "WrongNode"
    CHECKPOINT_NOT_FOUND = "CheckpointNotFound"
    INVALID_POLICY = "InvalidPolicy"
    NOT_EXPIRING = "NotExpiring"
    NO_TIERS = "NoTiers"
    # An operator declared the batch's node lost: its local tier is gone for good.
    NODE_LOST = "NodeLost"


def backoff(maximum: timedelta, attempts: int = 0, *never: FailureType) -> RetryPolicy:
    """Exponential backoff from 1 s up to `maximum`; `attempts` 0 retries without limit."""
    return RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=2.0,
        maximum_interval=maximum,
        maximum_attempts=attempts,
        non_retryable_error_types=[str(t) for t in never] or None,
    )


# Catalog-only activities: short (one transaction over ids, bounded by batches, not shards),
# retried for as long as the catalog is down. The timeout is also how long an attempt lost with a
# killed worker holds its workflow up before the retry: they do not heartbeat.
CATALOG_TIMEOUT = timedelta(seconds=30)
CATALOG_RETRY = backoff(timedelta(minutes=1), 0, FailureType.INVALID_POLICY)


def error_message(err: BaseException) -> str:
    """What an activity failure says, without Temporal's wrapping."""
    cause = err.__cause__ if isinstance(err, ActivityError) and err.__cause__ else err
    return str(cause) or type(cause).__name__
