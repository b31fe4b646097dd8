"""Where the bytes of a rank's file go on a load (a `sources.Placement`): each tensor's straight
into the memory of the tensor DCP loads it into, where the layouts allow, else into a buffer the
tensor is viewed from (never `torch.load`'s copy of it), and nothing is handed to DCP before the
file verified.

An item of a tensor is a `torch.save` archive: a zip of uncompressed records, `data.pkl` (the
tensor's dtype, size and strides, and which storage record holds its bytes) first, the storage's
record after it. The first bytes of the item (`HEAD`) are read to find them; the pickle is read
by an unpickler that knows only what a plain tensor's needs, and anything else is loaded by
`torch.load` from the item's buffer instead.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlanner, ReadItem

from tierpoint_client.errors import TierpointError
from tierpoint_client.sources import Pread, Range, Segment
from tierpoint_client.torch._files import TierpointStorageInfo

# Enough for a tensor's zip records before its bytes (a few hundred bytes in practice).
HEAD = 4096
# How much of an item is searched first for the records before its tensor's bytes.
WINDOW = 64 * 1024
_LOCAL = struct.Struct("<IHHHHHIIIHH")  # a zip local file header
_LOCAL_SIG = 0x04034B50
_DESCRIPTOR = b"PK\x07\x08"
# The storage classes torch.save names for each dtype (their `.dtype` warns of deprecation);
# a tensor of any other is read by torch.load.
_STORAGE_DTYPES = {
    "UntypedStorage": torch.uint8,
    "ByteStorage": torch.uint8,
    "CharStorage": torch.int8,
    "ShortStorage": torch.int16,
    "IntStorage": torch.int32,
    "LongStorage": torch.int64,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
    "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128,
    "BoolStorage": torch.bool,
}


@dataclass(frozen=True)
class Layout:
    """A plain tensor in a torch.save archive: its bytes are [start, start + nbytes) of it."""

    start: int
    nbytes: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int

    def view(self, item: memoryview) -> torch.Tensor:
        """The tensor, as a view of the item's buffer."""
        record = item[self.start : self.start + self.nbytes]
        flat = (
            torch.frombuffer(record, dtype=self.dtype)
            if self.nbytes
            else torch.empty(0, dtype=self.dtype)
        )
        return flat.as_strided(self.size, self.stride, self.storage_offset)

    def fills(self, target: torch.Tensor) -> bool:
        """Whether the record is exactly `target`'s memory, byte for byte."""
        return (
            type(target) is torch.Tensor
            and target.device.type == "cpu"
            and target.dtype == self.dtype
            and tuple(target.size()) == self.size
            and target.is_contiguous()
            and not (target.is_conj() or target.is_neg())
            and self.storage_offset == 0
            and self.stride == _contiguous(self.size)
            and self.nbytes == target.numel() * target.element_size()
        )


def layout(item: memoryview) -> Layout | None:
    """The layout of the archive that starts `item`, or None where it is not a plain tensor's
    or its records before the tensor's bytes are not all in `item`.

    torch writes each record's size after it (a data descriptor), not in its header: the pickle
    ends itself, and the small records before the storage's are followed by a descriptor whose
    size field says where they end. The storage's own size is the pickle's."""
    if sys.byteorder != "little":
        return None
    try:
        ref: _TensorRef | None = None
        pos = 0
        while pos + _LOCAL.size <= len(item):
            sig, _, flags, method, _, _, _, csize, _, nlen, xlen = _LOCAL.unpack_from(item, pos)
            if sig != _LOCAL_SIG or method != 0:
                return None
            start = pos + _LOCAL.size + nlen + xlen
            if start > len(item):
                return None
            name = bytes(item[pos + _LOCAL.size : pos + _LOCAL.size + nlen]).decode()
            if ref is not None and name.endswith(f"data/{ref.storage.key}"):
                s = ref.storage
                return Layout(start, s.nbytes, s.dtype, ref.size, ref.stride, ref.storage_offset)
            if name.endswith("data.pkl"):
                ref, size = _unpickle(item[start:])
            else:
                size = csize if not flags & 0x8 else _described_size(item, start)
                if name.endswith("byteorder") and bytes(item[start : start + size]) != b"little":
                    return None
            pos = start + size + (_descriptor(item, start + size, size) if flags & 0x8 else 0)
    except (struct.error, UnicodeDecodeError, ValueError):
        return None
    return None


def _windows(data: memoryview) -> Iterator[bytes]:
    """The first WINDOW bytes of `data`, then (if there are more) all of them: the records
    before a tensor's bytes are small, and copying the whole item (its tensor's bytes too) to
    search them cost more than the rest of a streamed load."""
    yield bytes(data[:WINDOW])
    if len(data) > WINDOW:
        yield bytes(data)


def _unpickle(data: memoryview) -> tuple[_TensorRef | None, int]:
    """The tensor a pickle describes (None: something else) and the pickle's length."""
    for window in _windows(data):
        stream = io.BytesIO(window)
        try:
            found = _MetaUnpickler(stream).load()
        except Exception as e:  # anything but a plain tensor's pickle: torch.load's to read
            if len(window) < len(data):
                continue  # perhaps only cut short by the window
            raise ValueError("not a plain tensor") from e
        return (found if isinstance(found, _TensorRef) else None), stream.tell()
    raise ValueError("not a plain tensor")


def _described_size(item: memoryview, start: int) -> int:
    """The size of the record at `start`: where the first descriptor that says so begins."""
    for data in _windows(item[start:]):
        at = data.find(_DESCRIPTOR)
        while at >= 0:
            if _descriptor(item, start + at, at):
                return at
            at = data.find(_DESCRIPTOR, at + 1)
    raise ValueError("no data descriptor")


def _descriptor(item: memoryview, at: int, size: int) -> int:
    """The length of the data descriptor at `at` of a record of `size` bytes, 0 if what is
    there does not describe it."""
    if bytes(item[at : at + 4]) != _DESCRIPTOR:
        return 0
    if len(item) >= at + 16 and struct.unpack_from("<I", item, at + 8)[0] == size:
        return 16
    if len(item) >= at + 24 and struct.unpack_from("<Q", item, at + 8)[0] == size:
        return 24  # zip64
    return 0


@dataclass(frozen=True)
class _StorageRef:
    key: str
    dtype: torch.dtype
    nbytes: int


@dataclass(frozen=True)
class _TensorRef:
    storage: _StorageRef
    storage_offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor_v2(
    storage: _StorageRef,
    storage_offset: int,
    size: Sequence[int],
    stride: Sequence[int],
    requires_grad: bool,
    backward_hooks: Any,
    metadata: Any = None,
) -> _TensorRef:
    if not isinstance(storage, _StorageRef) or metadata or backward_hooks:
        raise pickle.UnpicklingError("not a plain tensor")
    return _TensorRef(storage, int(storage_offset), tuple(size), tuple(stride))


class _StorageType:
    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


class _MetaUnpickler(pickle.Unpickler):
    """A tensor's description from its pickle, without its bytes; nothing else is resolved."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(_STORAGE_DTYPES[name])
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> _StorageRef:
        kind, storage_type, key, _location, numel = pid
        if kind != "storage" or not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError("not a storage")
        dtype = storage_type.dtype
        return _StorageRef(str(key), dtype, int(numel) * dtype.itemsize)


def _contiguous(size: tuple[int, ...]) -> tuple[int, ...]:
    stride, step = [], 1
    for n in reversed(size):
        stride.append(step)
        step *= max(n, 1)
    return tuple(reversed(stride))


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
