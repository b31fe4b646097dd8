"""Read one file placed, the way TierpointReader reads a DCP file (tierpoint_client.torch's
sources), from the copies a JSON spec lists in order; run in `.venv-torch`. Prints, as JSON, the
crc32c of the memory the file landed in, the tier each read came from, the copies reported
corrupt and the warnings.

Spec (argv[1], JSON): {"path", "size", "crc32c", "token", "heads": [offsets read to decide],
"copies": [{"tier", "url"}, ...]}. The placement puts every byte in one buffer but those of
[skip_from, skip_to) (read, verified and dropped); at each offset of `heads` it first reads a few
bytes through `pread`, as DCP's placement reads a tensor's header.
"""

from __future__ import annotations

import itertools
import json
import sys
import warnings
from collections.abc import Iterator

import tierpoint_client.torch  # noqa: F401 - the torch extra, as a training job imports it
from tierpoint_client.hashing import crc32c_hex, update
from tierpoint_client.models import Checkpoint, PlanEntry, TierInfo
from tierpoint_client.sources import Pread, Segment
from tierpoint_client.torch._copies import CheckpointFiles, ReadOptions

HEAD = 4096


class WholeFile:
    def __init__(self, size: int, heads: list[int], skip: tuple[int, int]) -> None:
        self.memory = memoryview(bytearray(size))
        self.size, self.heads, self.skip = size, sorted(heads), skip

    def segments(self, pread: Pread) -> Iterator[Segment]:
        cuts = sorted({0, self.size, *self.skip, *self.heads})
        for start, end in itertools.pairwise(cuts):
            if self.skip[0] <= start < self.skip[1]:
                yield Segment(start, end - start)
                continue
            if start in self.heads and end - start > HEAD:
                head = pread(start, HEAD)
                self.memory[start : start + len(head)] = head
                yield Segment(start, len(head), self.memory[start : start + len(head)], True)
                start += len(head)
            yield Segment(start, end - start, self.memory[start:end])


def main() -> None:
    spec = json.loads(sys.argv[1])
    copies = spec["copies"]
    shard = {
        "path": spec["path"],
        "size": spec["size"],
        "crc32c": spec["crc32c"],
        "node": "node-a",
        "replicas": [
            {"tier": c["tier"], "state": "verified", "location": c["url"], "url": c["url"]}
            for c in copies
        ],
    }
    checkpoint = Checkpoint.from_json(
        {
            "job": "j",
            "step": 1,
            "tiers": [{"tier": c["tier"], "state": "restorable"} for c in copies],
            "shards": [shard],
        }
    )
    tiers = [TierInfo(c["tier"], "peer", None, None, "", None, None) for c in copies]
    reported: list[str] = []

    def report(entry: PlanEntry, why: str) -> None:
        reported.append(entry.tier)

    files = CheckpointFiles(
        checkpoint,
        tiers,
        node=None,
        tier=None,
        options=ReadOptions(repopulate=False),
        report=report,
        token=spec["token"],
    )
    placement = WholeFile(spec["size"], spec["heads"], tuple(spec["skip"]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files.read(spec["path"], placement)
    lo, hi = spec["skip"]
    kept = bytes(placement.memory[:lo]) + bytes(placement.memory[hi:])
    out = {
        "crc32c": crc32c_hex(update(0, kept)),
        "read": files.stats.files,
        "reported": reported,
        "warnings": [str(w.message) for w in caught],
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
