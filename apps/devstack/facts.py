"""What a running `tierpoint dev` stack tells other programs (DIR/stack.json), readable without
importing the stack itself (the CLI's client commands start fast)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_DATA_DIR = Path(".tierpoint/dev")
DEFAULT_API_PORT = 8080
DEFAULT_NODES = 2
BUCKET = "tierpoint-dev"
STACK_JSON = "stack.json"
STACK_ENV = "stack.env"
PID_FILE = "dev.pid"
# The environment prefix of the stack's own S3 keys: each tier on the stack's S3 names it
# (`credentials_env`), so the keys of the embedded S3 go to its tiers only, never to a tier of
# another endpoint (which keeps the standard AWS chain or credentials of its own).
S3_CREDENTIALS_ENV = "TIERPOINT_DEV_S3"


class StackNotRunning(RuntimeError):
    pass


@dataclass(frozen=True)
class S3Facts:
    endpoint_url: str
    bucket: str
    region: str
    access_key_id: str
    secret_access_key: str

    def credential_vars(self) -> dict[str, str]:
        """The variables the stack's S3 tiers read their keys from."""
        return {
            f"{S3_CREDENTIALS_ENV}_ACCESS_KEY_ID": self.access_key_id,
            f"{S3_CREDENTIALS_ENV}_SECRET_ACCESS_KEY": self.secret_access_key,
        }


@dataclass(frozen=True)
class StackInfo:
    """What DIR/stack.json says, nothing more. `token` is the stack's admin token: the file is
    readable by its owner only."""

    api_url: str
    token: str | None
    nodes: dict[str, str]  # node id -> its root on the (first) local tier
    shared_root: str | None  # the first shared tier's root; None without a shared tier
    s3: S3Facts  # the stack's own S3 endpoint (in memory)
    # The API's Prometheus metrics (their own listener; None in facts of an older stack).
    metrics_url: str | None = None
    # The tiers the stack runs, fastest first, as settings (TIERPOINT_TIERS) would give them.
    tiers: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StackInfo:
        return cls(
            api_url=data["api_url"],
            token=data.get("token"),
            nodes=dict(data["nodes"]),
            shared_root=data["shared_root"],
            s3=S3Facts(**data["s3"]),
            metrics_url=data.get("metrics_url"),
            tiers=list(data.get("tiers", [])),
        )


def read_stack_info(data_dir: Path) -> StackInfo:
    path = data_dir / STACK_JSON
    try:
        return StackInfo.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        raise StackNotRunning(
            f"no running stack: {path} does not exist (start one with `tierpoint dev"
            f" --data-dir {data_dir}`)"
        ) from None


def node_ids(count: int) -> list[str]:
    return [f"node-{i}" for i in range(1, count + 1)]
