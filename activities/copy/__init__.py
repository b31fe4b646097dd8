"""Copy + verify of one batch of shards to a tier, from the tier before it (the lifecycle) or from
whichever tier still holds each shard verified (repair): both go through `copy_to`.

Each shard is read once off the source with its crc32c computed in the same pass, written
atomically by the destination store, then read back from the destination. The read-back of a
shard runs in a helper thread while the next shard is copied (a pipeline one shard deep): the
copy is bound by the source and the write, the verify by the destination's reads.

The package's private modules hold one concept each: the fan-out over a batch's sources
(`_fan_out`) and one source's copy with its read-back (`_batch`); this module is the one import
path of what they offer.
"""

from ._batch import RECOPIES_AFTER_BAD_READ_BACK, REREADS_AFTER_TRANSIT_MISMATCH, BatchCopy
from ._fan_out import Destination, Source, copy_to, mark_copying

__all__ = [
    "RECOPIES_AFTER_BAD_READ_BACK",
    "REREADS_AFTER_TRANSIT_MISMATCH",
    "BatchCopy",
    "Destination",
    "Source",
    "copy_to",
    "mark_copying",
]
