"""Helpers of the training-side client tests: the running stack they talk to, and shard trees
written and read back."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tierpoint_client import Client

from tierpoint.config import Settings


@dataclass(frozen=True)
class Stack:
    settings: Settings
    api_url: str
    client: Client
    nodes: tuple[str, ...]
    # The admin token `client` sends, for processes that talk to the API.
    token: str
    # The API's own /metrics listener (tests.helpers.scrape reads it).
    metrics_port: int
    # True while the API runs no request: it counts one in its metrics only once the request's
    # background work (e.g. a retention request after a lease's release) is done too.
    api_idle: Callable[[], bool]

    def local_dir(self, node: str, job: str, step: int) -> Path:
        return self.settings.tier("ssd").root_for(node) / job / str(step)

    def shared_dir(self, job: str, step: int) -> Path:
        return self.settings.tier("lustre").root_for(None) / job / str(step)


def write_shards(directory: Path, sizes: dict[str, int]) -> dict[str, bytes]:
    """Random shards under directory; returns {relative path: bytes}."""
    written = {}
    for rel, size in sizes.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        path.write_bytes(data)
        written[rel] = data
    return written


def read_tree(root: Path) -> dict[str, bytes]:
    """Every file under root (temporary files included, so leftovers show up)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
