"""DIR/stack.env: what lets programs in another shell join a running dev stack."""

from __future__ import annotations

import json
import shlex
import sysconfig
from pathlib import Path

from apps.devstack.facts import S3_CREDENTIALS_ENV, StackInfo
from tierpoint.config import Settings


def stack_env_text(info: StackInfo, settings: Settings, data_dir: Path) -> str:
    """A shell-sourceable file with the facts of stack.json and the settings that let
    `tierpoint worker` or `tierpoint api` join the stack. It also puts the `tierpoint` that runs
    the stack on PATH, and names the data dir, so that a client command after `source stack.env`
    finds both whatever the current directory and however the stack was started."""
    tiers = json.dumps([t.model_dump(mode="json", exclude_defaults=True) for t in settings.tiers])
    values: dict[str, str] = {
        "TIERPOINT_DATA_DIR": str(data_dir),
        "TIERPOINT_API_URL": info.api_url,
        "TIERPOINT_METRICS_URL": info.metrics_url or "",
        "TIERPOINT_TOKEN": info.token or "",
        "TIERPOINT_DATABASE_URL": settings.database_url,
        "TIERPOINT_TEMPORAL_ADDRESS": settings.temporal_address,
        "TIERPOINT_TEMPORAL_NAMESPACE": settings.temporal_namespace,
        "TIERPOINT_TIERS": tiers,
        "TIERPOINT_NODES": ",".join(info.nodes),
        "TIERPOINT_SHARED_ROOT": info.shared_root or "",
        "TIERPOINT_S3_BUCKET": info.s3.bucket,
        # The stack's own S3 under its own names, read by its tiers (`credentials_env`): never
        # AWS_*, which would hand these keys to every other S3 endpoint of the shell too.
        f"{S3_CREDENTIALS_ENV}_ENDPOINT_URL": info.s3.endpoint_url,
        f"{S3_CREDENTIALS_ENV}_REGION": info.s3.region,
        **info.s3.credential_vars(),
    }
    for node, root in info.nodes.items():
        key = "TIERPOINT_NODE_ROOT_" + node.upper().replace("-", "_").replace(".", "_")
        values[key] = root
    lines = ["# Written by `tierpoint dev`; removed when it stops. Use: source stack.env"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in values.items()]
    # Where this environment's console scripts are: `tierpoint` of the running stack.
    scripts = sysconfig.get_path("scripts")
    lines.append(f'export PATH={shlex.quote(scripts)}:"$PATH"')
    return "\n".join(lines) + "\n"
