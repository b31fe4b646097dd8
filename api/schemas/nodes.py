"""Bodies of the node endpoints."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class NodeLostOut(BaseModel):
    node: str
    lost_at: datetime
    changed: bool = Field(description="This request declared it; false: it was lost already.")
    replicas_lost: int = Field(
        description="Replicas this request turned `lost`: the node's local copies and the peer "
        "copies it held for other nodes."
    )
    # The wire keeps the field's first name (clients read it), from before tier copies had
    # their name.
    tier_copies_failed: int = Field(
        serialization_alias="markers_failed",
        description="Tier copies this request turned `failed`: the local tiers' of checkpoints "
        "with shards on the node, and the peer tiers' whose copy it held (those are copied "
        "again). A checkpoint of which the node held only peer copies keeps its local copies.",
    )
    checkpoints: int = Field(
        description="Checkpoints it affected: with shards on the node, or a peer copy it held."
    )
    lifecycles_signalled: int = Field(description="Running lifecycles told to stop waiting.")
    lifecycles_not_running: int = Field(
        description="In-flight checkpoints without a running lifecycle (its plan sees the node "
        "lost when it starts)."
    )
    lifecycles_unreachable: int = Field(
        description="Lifecycles that could not be told (Temporal unreachable): repeat the request."
    )
    peer_rereplications: int = Field(
        default=0,
        description="Checkpoints whose peer copies the node held are being copied to other nodes "
        "(runs started; one that could not start is retried by repeating the request).",
    )
