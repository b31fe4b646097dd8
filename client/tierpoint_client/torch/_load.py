"""Where the bytes of a rank's file go on a load (a `sources.Placement`): each tensor's straight
into the memory of the tensor DCP loads it into, where the layouts allow, else into a buffer the
tensor is viewed from (never `torch.load`'s copy of it); and nothing is handed to DCP before the
file verified.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlanner, ReadItem

from tierpoint_client.errors import TierpointError
from tierpoint_client.sources import Pread, Range, Segment
from tierpoint_client.torch._files import TierpointStorageInfo
from tierpoint_client.torch._layout import HEAD, layout


class FileLoad:
    """The placement of one rank's reads from one file, and what is done with them once the
    file verified: tensors committed, the rest loaded from buffers."""

    def __init__(
        self, planner: LoadPlanner, items: Sequence[ReadItem], infos: Sequence[TierpointStorageInfo]
    ) -> None:
        self.planner = planner
        self.by_range: dict[Range, list[ReadItem]] = {}
        # Each range's own crc32c, from the verified `.metadata` (None in older checkpoints).
        self.items: dict[Range, str | None] = {}
        for item, info in zip(items, infos, strict=True):
            self.by_range.setdefault((info.offset, info.length), []).append(item)
            self.items[(info.offset, info.length)] = info.item_crc32c
        self.file_size = infos[0].file_size
        self._targets: dict[int, torch.Tensor] = {}
        self.direct: list[ReadItem] = []  # read straight into their targets
        self.buffers: dict[Range, memoryview] = {}  # the other ranges' bytes

    def target(self, item: ReadItem) -> torch.Tensor:
        """DCP's tensor for the item, resolved once for every copy read."""
        key = id(item)
        if key not in self._targets:
            self._targets[key] = self.planner.resolve_tensor(item).detach()
        return self._targets[key]

    def segments(self, pread: Pread) -> Iterator[Segment]:
        # Lazily, item by item: a streamed read reads an item's head only once every byte
        # before it has gone where the earlier segments say.
        self.direct, self.buffers = [], {}
        pos = 0
        for (offset, length), items in sorted(self.by_range.items()):
            if offset < pos:
                raise TierpointError(f"items overlap at byte {offset} of the file")
            if offset > pos:
                yield Segment(pos, offset - pos)
            yield from self._item(offset, length, items, pread)
            pos = offset + length
        if pos < self.file_size:
            yield Segment(pos, self.file_size - pos)

    def _item(self, offset: int, length: int, items: list[ReadItem], pread: Pread) -> list[Segment]:
        if len(items) == 1 and items[0].type != LoadItemType.BYTE_IO and length > HEAD:
            head = pread(offset, HEAD)
            placed = self._direct(offset, length, items[0], head)
            if placed is not None:
                return placed
            buf = memoryview(bytearray(length))
            buf[: len(head)] = head
            self.buffers[(offset, length)] = buf
            rest = Segment(offset + len(head), length - len(head), buf[len(head) :])
            return [Segment(offset, len(head), buf[: len(head)], filled=True), rest]
        buf = memoryview(bytearray(length))
        self.buffers[(offset, length)] = buf
        return [Segment(offset, length, buf)]

    def _direct(
        self, offset: int, length: int, item: ReadItem, head: memoryview
    ) -> list[Segment] | None:
        """The item's segments when its tensor's bytes can go straight into its target."""
        found = layout(head)
        if found is None or found.start + found.nbytes > length:
            return None
        if any(item.storage_offsets) or tuple(item.lengths) != found.size:
            return None  # a part of the stored tensor: viewed from a buffer and copied
        target = self.target(item)
        if not found.fills(target):
            return None
        memory = memoryview(target.reshape(-1).view(torch.uint8).numpy())
        end = found.start + found.nbytes
        # The head holds the first bytes of the tensor (maybe all of them): copied over.
        early = min(len(head), end) - found.start
        memory[:early] = head[found.start : found.start + early]
        segs = [Segment(offset, len(head), head, filled=True)]
        if end > len(head):
            segs.append(Segment(offset + len(head), end - len(head), memory[early:]))
        if length > max(end, len(head)):
            tail = max(end, len(head))
            segs.append(Segment(offset + tail, length - tail))
        self.direct.append(item)
        return segs

    def finish(self, got: Mapping[Range, Any]) -> None:
        """Hand the verified file's items to DCP: `got` holds the ranges' bytes when the file
        was read whole (S3) rather than placed."""
        if got:
            self.direct, self.buffers = [], {r: memoryview(b) for r, b in got.items()}
        for item in self.direct:
            self.planner.commit_tensor(item, self.target(item))
        for span, items in self.by_range.items():
            if span in self.buffers:
                for item in items:
                    self._apply(item, self.buffers[span])

    def _apply(self, item: ReadItem, buf: memoryview) -> None:
        if item.type == LoadItemType.BYTE_IO:
            self.planner.load_bytes(item, io.BytesIO(buf))
            return
        found = layout(buf)
        tensor = None
        if found is not None and found.start + found.nbytes <= len(buf):
            try:
                tensor = found.view(buf)
            except RuntimeError:  # strides beyond the record: torch.load says what is wrong
                tensor = None
        if tensor is None:
            tensor = torch.load(io.BytesIO(buf), map_location="cpu", weights_only=True)
        for dim, (start, n) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
            if start != 0 or n != tensor.size(dim):
                tensor = tensor.narrow(dim, start, n)
        target = self.target(item)
        if target.size() != tensor.size():
            stored, wanted = tuple(tensor.size()), tuple(target.size())
            raise TierpointError(f"{item.storage_index}: stored {stored}, wanted {wanted}")
        target.copy_(tensor)
        self.planner.commit_tensor(item, target)
