"""One worker process serving many nodes' task queues.

In production a node worker serves its own node. A rehearsal on one machine (and a host that
stands in for several nodes) runs one process for hundreds of nodes' queues; Temporal polls one
queue per poll, so such a process still needs a poller per queue, and a thread for each queue's
slot once it serves more than 64 nodes; nothing else of it has to grow with the nodes:

- pollers: one per queue once a process serves more than one node (a node's stages run at most
  a few batches at once; the default of five pollers per queue was 5,000 long polls held open
  against the server for 1,000 nodes);
- activity slots and threads: one pool for all the queues, with a thread for every slot. The
  single node's sixteen slots per queue while 64 threads cover them all (a few nodes: the dev
  stack's two run their checkpoints' seals and copies as a node of their own would), fewer as
  the nodes grow, down to one per queue, and beyond 64 nodes one thread per queue. Never more
  slots than threads: a task the SDK takes into a slot is started as far as the server knows,
  and one waiting in the pool's queue for a thread cannot heartbeat. At 1,000 simulated nodes
  (250 queues and 64 threads a process, two slots a queue) up to 439 tasks a process were
  started with 64 threads to run them, and the ones that waited past the batch heartbeat
  timeout were timed out and run again;
- the catalog: every node reports in with one statement per round, not one per node;
- stores: one per (tier, node), opened on first use and shared (`activities.stores.Stores`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tierpoint.catalog.engine import Sessions
from tierpoint.catalog.node.registry import upsert_nodes

# A process that serves one node keeps what one node's copies need.
SINGLE_NODE_SLOTS = 16
SINGLE_NODE_POLLERS = 5
SHARED_PROCESS_POLLERS = 1
# Threads for all the node queues of one process while they give every queue a slot; a process
# of more nodes has one thread per queue.
SHARED_PROCESS_THREADS = 64


@dataclass(frozen=True)
class NodeQueueSizing:
    slots: int  # activities one node queue runs at once (max_concurrent_activities)
    pollers: int  # long polls one node queue holds open
    threads: int  # the activity threads of all the process's node queues together


def sizing(nodes: int) -> NodeQueueSizing:
    """How a process serving `nodes` node queues sizes each queue and its thread pool."""
    if nodes <= 1:
        return NodeQueueSizing(SINGLE_NODE_SLOTS, SINGLE_NODE_POLLERS, SINGLE_NODE_SLOTS * nodes)
    # Slots are what lets one node's batches of different checkpoints run at once (each
    # checkpoint's window is its own): two slots a queue made a storm of checkpoints on two nodes
    # wait seconds per seal for a slot. Each has its thread (the module's docstring says why).
    slots = max(1, min(SINGLE_NODE_SLOTS, SHARED_PROCESS_THREADS // nodes))
    return NodeQueueSizing(slots, SHARED_PROCESS_POLLERS, slots * nodes)


def report_in(
    sessions: Sessions,
    nodes: Sequence[str],
    roots: Mapping[str, dict[str, Any]],
    data_urls: Mapping[str, str | None] | None = None,
    domains: Mapping[str, str | None] | None = None,
) -> None:
    """Every node of the process reports in (last_seen, its local roots, its data endpoint, its
    failure domain) in one transaction."""
    if not nodes:
        return
    with sessions.begin() as s:
        upsert_nodes(s, {n: roots[n] for n in nodes}, data_urls, domains)
