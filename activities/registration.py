"""Which activities a worker serves, read off the activity classes rather than listed by hand.

The shared worker serves every `@activity.defn` method of its activity objects; a node's worker
serves the ones marked `@on_node_queue`: those a workflow sends to a node's queue because they read
or write that node's local tier. Adding an activity method to a class registers it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

# Set by temporalio's activity.defn on the function it decorates.
_DEFINITION = "__temporal_activity_definition"
_NODE_QUEUE = "_tierpoint_node_queue"


def on_node_queue(fn: F) -> F:
    """Marks an activity that node workers serve (it may touch their local tier)."""
    setattr(fn, _NODE_QUEUE, True)
    return fn


def activities_of(*objects: object, node_queue: bool = False) -> list[Callable[..., Any]]:
    """The bound activity methods of `objects` (only the node-queue ones with `node_queue`)."""
    found: list[Callable[..., Any]] = []
    for obj in objects:
        for name, fn in inspect.getmembers(type(obj), inspect.isfunction):
            if not hasattr(fn, _DEFINITION):
                continue
            if node_queue and not getattr(fn, _NODE_QUEUE, False):
                continue
            found.append(getattr(obj, name))
    return found
