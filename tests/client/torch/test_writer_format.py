"""What TierpointWriter leaves on the local tier, read back in the torch venv without the reader:
every tensor item is torch.save's format (torch.load reads it alone) written without torch's zip
CRC32 (the writer's own crc32c covers it), and every item's and file's crc32c, as `.metadata`
records them, match the bytes. Under a job name the server would refuse, it writes nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

from tests.client.torch.ranks import TORCH_PYTHON, new_job, ranks, run_ranks
from tests.helpers.client import Stack

CHECK = r"""
import io, json, pickle, sys, zipfile
from pathlib import Path
import crc32c, torch
d = Path(sys.argv[1])
meta = pickle.loads((d / ".metadata").read_bytes())
out = []
for index, info in meta.storage_data.items():
    data = (d / info.path).read_bytes()
    item = data[info.offset : info.offset + info.length]
    entry = {
        "item_crc_ok": f"{crc32c.crc32c(item):08x}" == info.item_crc32c,
        "file_crc_ok": f"{crc32c.crc32c(data):08x}" == info.crc32c and len(data) == info.file_size,
        "tensor": index.fqn.startswith("model."),
    }
    if entry["tensor"]:
        entry["loads"] = isinstance(torch.load(io.BytesIO(item)), torch.Tensor)
        entry["zip_crcs"] = sorted({z.CRC for z in zipfile.ZipFile(io.BytesIO(item)).infolist()})
    out.append(entry)
print(json.dumps(out))
"""


async def test_items_are_torch_save_records_without_zip_crc_and_with_our_crc32c(
    stack: Stack, tmp_path: Path
) -> None:
    job, step = new_job(), 5
    await ranks(stack, tmp_path, "save", job, world=1, step=step)
    local = stack.local_dir(stack.nodes[0], job, step)
    proc = await asyncio.to_thread(
        subprocess.run,
        [str(TORCH_PYTHON), "-c", CHECK, str(local)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    items = json.loads(proc.stdout.strip().splitlines()[-1])
    tensors = [i for i in items if i["tensor"]]
    assert tensors, items
    assert all(i["item_crc_ok"] and i["file_crc_ok"] for i in items), items
    assert all(i["loads"] for i in tensors), tensors
    # Every record of every tensor item: no zip CRC32 computed (the per-call fast path ran).
    assert all(i["zip_crcs"] == [0] for i in tensors), tensors


async def test_a_save_under_a_bad_job_name_writes_nothing(stack: Stack, tmp_path: Path) -> None:
    """`dcp.save(..., storage_writer=TierpointWriter("../escape", 5))`: refused with the rule in
    words before a file is written, where the files would have gone outside the local root."""
    root = stack.local_dir(stack.nodes[0], "j", 5).parent.parent
    before = set(root.parent.rglob("*"))
    failed = await run_ranks(stack, tmp_path, "save", "../escape", world=1, step=5, expect_ok=False)
    assert "InvalidJobNameError: job name '../escape' is not valid: a job name is 1-128" in (
        failed.logs
    ), failed.logs
    assert not (root.parent / "escape").exists()
    assert set(root.parent.rglob("*")) <= before
