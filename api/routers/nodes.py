"""Nodes: an operator declares a node lost when its local tier is gone for good."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path

from api.auth import Actor, require
from api.deps import SessionDep, StateDep
from api.gate import GatedRoute
from api.problems import problem_responses
from api.schemas.nodes import NodeLostOut
from tierpoint.auth import Scope
from tierpoint.services import node_lost

router = APIRouter(prefix="/v1/nodes", tags=["nodes"], route_class=GatedRoute)

NodeId = Annotated[
    str,
    Path(
        min_length=1,
        max_length=128,
        pattern=r"^[^\x00-\x1f\x7f/]+$",
        description="Node id, as its worker reports in.",
    ),
]


@router.post(
    "/{node}/lost",
    dependencies=[Depends(require(Scope.OPERATE))],
    response_model=NodeLostOut,
    responses=problem_responses(404, 422),
    summary="Declare a node lost: its local copies are gone, nothing waits on it any more",
)
async def declare_node_lost(
    node: NodeId, session: SessionDep, state: StateDep, actor: Actor
) -> NodeLostOut:
    """Idempotent. Its local replicas become `lost`; local tier copies of checkpoints with shards
    there become `failed`; running lifecycles stop waiting for its queue and finish from the
    tiers the shards reached (or fail saying the node was lost). The peer copies it held are
    copied again to other nodes. Registrations naming the node are refused from now on."""
    lost = await node_lost.declare(session, state.settings, node, actor)
    # A second transaction on purpose: the lifecycles told below read the lost node from the
    # catalog, so the declaration must be committed before they are (the unit's own commit at
    # the end then has nothing left to do).
    await session.commit()
    temporal = await state.temporal.client()
    told = await node_lost.tell_lifecycles(temporal, lost)
    rereplicating = await node_lost.rereplicate(temporal, lost)
    return NodeLostOut(
        node=lost.node,
        lost_at=lost.lost_at,
        changed=lost.changed,
        replicas_lost=lost.replicas_lost,
        tier_copies_failed=lost.tier_copies_failed,
        checkpoints=len(lost.checkpoints),
        lifecycles_signalled=told.signalled,
        lifecycles_not_running=told.not_running,
        lifecycles_unreachable=told.unreachable,
        peer_rereplications=rereplicating,
    )
