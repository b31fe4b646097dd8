"""Where TierpointReader finds a tensor's bytes inside a stored item (the torch.save archive the
writer streams, or one torch.save wrote): for every dtype and shape the view it makes of the
item's buffer equals what torch.load returns, and what is not a plain tensor is left to
torch.load. Run in the torch venv, without the stack."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.client.torch.ranks import TORCH_PYTHON

# Starts processes itself (derivation sees only fixtures): tests/helpers/tiers.py.
pytestmark = pytest.mark.full_stack

CHECK = r"""
import io, json
import torch
from tierpoint_client.torch._load import HEAD, layout
from tierpoint_client.torch.writer import _serialize_tensor

class Sink(io.BytesIO):
    crc = 0

g = torch.Generator().manual_seed(3)
cases = {
    "float32": torch.randn(33, 7, generator=g),
    "bfloat16": torch.randn(5, 9, generator=g).to(torch.bfloat16),
    "float16": torch.randn(64, generator=g).half(),
    "int64": torch.randint(-9, 9, (10, 4), generator=g),
    "uint8": torch.randint(0, 255, (3, 3, 3), generator=g).to(torch.uint8),
    "bool": torch.rand(17, generator=g) > 0.5,
    "complex64": torch.randn(6, dtype=torch.complex64, generator=g),
    "scalar": torch.tensor(3.5),
    "empty": torch.empty(0, 5),
    "large": torch.randn(600, 1024, generator=g),
    "transposed": torch.randn(40, 50, generator=g).t(),
}
out = {}
for name, t in cases.items():
    for how in ("writer", "torch.save"):
        sink = Sink()
        if how == "writer":
            _serialize_tensor(t, sink)
        else:
            torch.save(t, sink)
        item = memoryview(bytearray(sink.getvalue()))
        found = layout(item)
        want = torch.load(io.BytesIO(item), weights_only=True)
        got = found.view(item) if found is not None else None
        out[f"{name} {how}"] = {
            "found": found is not None,
            "equal": got is not None and got.dtype == want.dtype and got.stride() == want.stride()
                and torch.equal(got, want),
            "head_only": found is not None and found.start < HEAD,
        }
# Not a plain tensor: torch.load's to read.
sink = Sink()
torch.save(torch.nn.Parameter(torch.ones(3)), sink)
out["parameter"] = {"found": layout(memoryview(bytearray(sink.getvalue()))) is not None}
out["garbage"] = {"found": layout(memoryview(bytearray(b"PK\x03\x04" + bytes(200)))) is not None}
print(json.dumps(out))
"""


def test_a_tensor_is_viewed_where_torch_load_finds_it_and_anything_else_is_left_to_it() -> None:
    proc = subprocess.run(
        [str(TORCH_PYTHON), "-c", CHECK], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    cases = json.loads(proc.stdout.strip().splitlines()[-1])
    plain = {k: v for k, v in cases.items() if k not in ("parameter", "garbage")}
    assert all(v["found"] and v["equal"] and v["head_only"] for v in plain.values()), plain
    assert not cases["parameter"]["found"]
    assert not cases["garbage"]["found"]


COPIES = r"""
import io, json, tracemalloc
import torch
from tierpoint_client.torch._load import layout
from tierpoint_client.torch.writer import _serialize_tensor

class Sink(io.BytesIO):
    crc = 0

out = {}
t = torch.ones(16, 1024, 1024, dtype=torch.uint8)  # 16 MiB
for how in ("writer", "torch.save"):
    sink = Sink()
    _serialize_tensor(t, sink) if how == "writer" else torch.save(t, sink)
    item = memoryview(bytearray(sink.getvalue()))
    tracemalloc.start()
    found = layout(item)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    out[how] = {"found": found is not None and torch.equal(found.view(item), t), "peak": peak}
print(json.dumps(out))
"""


def test_finding_a_large_items_tensor_copies_none_of_its_bytes() -> None:
    """An item read whole (a copy streamed from S3 or a peer that was not placed) is searched
    for its records before the tensor's bytes without copying the tensor's: a copy per record
    was most of a large S3 load."""
    proc = subprocess.run(
        [str(TORCH_PYTHON), "-c", COPIES], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    cases = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(c["found"] for c in cases.values()), cases
    assert all(c["peak"] < 1024 * 1024 for c in cases.values()), cases
