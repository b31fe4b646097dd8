"""A coded peer tier's copy stage: the activities that cut a node's files into stripes and move
them to their holders."""

from __future__ import annotations

from tierpoint.contract.lifecycle import BatchInput

ENCODE_BATCH = "stripes.encode_batch"
UNSTAGE_BATCH = "stripes.unstage_batch"


class EncodeInput(BatchInput):
    """Cut the batch's shards (sealed on `source`, the node's local tier) into the stripes of
    the coded peer tier `tier` (and, once the holders verified them, drop them from the staging
    area: `UNSTAGE_BATCH`); runs on the shards' node's queue."""

    source: str
    tier: str
    # The stripe holders the lifecycle's plan chose, stripe i on the i-th; None: the encoder
    # places them by the same rule now.
    holders: list[str] | None = None


PULL_BATCH = "stripes.pull_batch"


class PullInput(BatchInput):
    """Pull the stripes of the batch's shards (of `batch.node`) that the coded tier `tier`
    places on `batch.holder`, from the shards' node's staging area; runs on the holder's queue."""

    tier: str


REBUILD_BATCH = "stripes.rebuild_batch"


class RebuildInput(PullInput):
    """Cut again the stripes of the batch's shards (of `batch.node`) that the coded tier `tier`
    re-placed on `batch.holder`, from k other stripes of each set read off their holders' data
    endpoints; runs on the new holder's queue."""
