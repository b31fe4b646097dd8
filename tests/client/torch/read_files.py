"""Read a checkpoint's files the way TierpointReader does (tierpoint_client.torch's sources), run
in `.venv-torch`: prints {path: [size, crc32c]} of what each verified read returned, as JSON.

Usage: read_files.py JOB STEP TIER  (API URL and token from TIERPOINT_API_URL / TIERPOINT_TOKEN)
"""

from __future__ import annotations

import json
import sys

import tierpoint_client.torch  # noqa: F401 - the torch extra, as a training job imports it
from tierpoint_client import Client
from tierpoint_client.hashing import crc32c_hex, update
from tierpoint_client.torch._copies import CheckpointFiles


def main() -> None:
    job, step, tier = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    client = Client.from_env()
    files = CheckpointFiles(client.checkpoint(job, step), client.tiers(), node=None, tier=tier)
    out: dict[str, list[object]] = {}
    for path in files.copies:
        data = files.read_all(path)
        out[path] = [len(data), crc32c_hex(update(0, data))]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
