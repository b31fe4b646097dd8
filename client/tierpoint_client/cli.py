"""`python -m tierpoint_client`: the client's calls from a shell (job scripts, debugging).

Answers are printed as JSON on stdout; errors as one line on stderr with a non-zero exit status
(2 for API errors, 3 when no copy of a shard could be read and verified, 130 when interrupted,
1 otherwise).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from tierpoint_client.client import Client
from tierpoint_client.errors import (
    ApiError,
    ChecksumMismatchError,
    NoVerifiedCopyError,
    RestoreInterrupted,
    TierpointError,
)
from tierpoint_client.manifest import build_manifest


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def _print(value: Any) -> None:
    json.dump(value, sys.stdout, default=_json_default, indent=2)
    sys.stdout.write("\n")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tierpoint_client", description=__doc__)
    p.add_argument("--api-url", default=os.environ.get("TIERPOINT_API_URL"), help="API base URL")
    p.add_argument("--token", default=os.environ.get("TIERPOINT_TOKEN") or None)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP request")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("register", help="hash a checkpoint directory and register it")
    r.add_argument("job")
    r.add_argument("step", type=int)
    r.add_argument("directory")
    r.add_argument("--node", required=True, help="the node whose local tier holds the directory")
    r.add_argument("--metadata", default="{}", help="JSON object, e.g. '{\"loss\": 1.9}'")
    r.add_argument("--workers", type=int, default=8, help="hashing threads")

    m = sub.add_parser("manifest", help="print the manifest of a directory without registering")
    m.add_argument("directory")
    m.add_argument("--node", required=True)
    m.add_argument("--workers", type=int, default=8)

    la = sub.add_parser("latest", help="the latest restorable checkpoint and its restore plan")
    la.add_argument("job")
    la.add_argument("--tier")
    la.add_argument("--node")

    w = sub.add_parser("wait", help="block until a checkpoint is restorable on a tier")
    w.add_argument("job")
    w.add_argument("step", type=int)
    w.add_argument("tier")
    w.add_argument("--wait-timeout", type=float, default=600.0)

    rs = sub.add_parser("restore", help="restore the latest restorable checkpoint, verified")
    rs.add_argument("job")
    rs.add_argument("dest")
    rs.add_argument("--tier")
    rs.add_argument("--node")
    rs.add_argument("--workers", type=int, default=4)
    existing = rs.add_mutually_exclusive_group()
    existing.add_argument(
        "--force",
        action="store_const",
        dest="existing",
        const="overwrite",
        default="refuse",
        help="restore into a non-empty DEST: the checkpoint's files replace those of the same "
        "name, the others stay",
    )
    existing.add_argument(
        "--clean",
        action="store_const",
        dest="existing",
        const="clean",
        help="restore into a non-empty DEST and remove every entry that is not the checkpoint's",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "manifest":
            _print(build_manifest(args.directory, args.node, workers=args.workers))
            return 0
        if not args.api_url:
            print("error: pass --api-url or set TIERPOINT_API_URL", file=sys.stderr)
            return 1
        client = Client(args.api_url, token=args.token, timeout=args.timeout)
        if args.command == "register":
            metadata = json.loads(args.metadata)
            if not isinstance(metadata, dict):
                print("error: --metadata must be a JSON object", file=sys.stderr)
                return 1
            _print(
                client.register(
                    args.job, args.step, args.directory, args.node, metadata, workers=args.workers
                )
            )
        elif args.command == "latest":
            latest = client.latest(args.job, tier=args.tier, node=args.node)
            if latest is None:
                print(f"no restorable checkpoint for {args.job}", file=sys.stderr)
                return 4
            _print(latest)
        elif args.command == "wait":
            _print(client.wait_restorable(args.job, args.step, args.tier, args.wait_timeout))
        elif args.command == "restore":
            result = client.restore(
                args.job,
                args.dest,
                tier=args.tier,
                node=args.node,
                workers=args.workers,
                existing=args.existing,
            )
            _print(
                {
                    "job": result.job,
                    "step": result.step,
                    "dest_dir": result.dest_dir,
                    "bytes": result.bytes_total,
                    "seconds": round(result.seconds, 3),
                    "tiers_used": result.tiers_used,
                    "files": [f.path for f in result.files],
                    "removed": list(result.removed),
                    "kept": list(result.kept),
                }
            )
    except ApiError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (NoVerifiedCopyError, ChecksumMismatchError) as e:
        print(f"error: {_with_notes(e)}", file=sys.stderr)
        return 3
    except RestoreInterrupted as e:
        print(str(e), file=sys.stderr)
        return 130
    except (TierpointError, TimeoutError, ValueError, OSError) as e:
        print(f"error: {_with_notes(e)}", file=sys.stderr)
        return 1
    return 0


def _with_notes(e: BaseException) -> str:
    """The error and what the restore noted on it (what the destination holds now)."""
    return "; ".join([str(e), *getattr(e, "__notes__", ())])
