"""The configuration reference (docs/configuration.md), generated from the settings model so that
it cannot drift from it: `python -m tierpoint.config_reference [PATH]` rewrites it, and
tests/tierpoint/test_config_reference.py fails when the committed file is stale."""

from __future__ import annotations

import argparse
import json
import sys
import types
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from tierpoint.config import Settings
from tierpoint.tier_config import TierConfig

DOC = Path("docs") / "configuration.md"
REGENERATE = "python -m tierpoint.config_reference"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        inner = " | ".join(_type_name(a) for a in args)
        return inner + " (optional)" if len(args) < len(get_args(annotation)) else inner
    if origin is list:
        return f"list of {_type_name(get_args(annotation)[0])}"
    if annotation is TierConfig:
        return "tier (below)"
    if annotation is timedelta:
        return "duration"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(f"`{m.value}`" for m in annotation)
    return str(getattr(annotation, "__name__", annotation))


def _constraints(info: FieldInfo) -> str:
    bounds = []
    for item in info.metadata:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            if isinstance(item, getattr(annotated_types, attr.capitalize())):
                bounds.append(f"{sign} {getattr(item, attr)}")
    return f", {', '.join(bounds)}" if bounds else ""


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if value is None:
        return "none"
    assert info.annotation is not None
    shown = f"`{json.dumps(TypeAdapter(info.annotation).dump_python(value, mode='json'))}`"
    mib = 1 << 20
    if isinstance(value, int) and not isinstance(value, bool) and value >= mib and value % mib == 0:
        shown += f" ({value // mib} MiB)"
    return shown


def _rows(model: type[BaseModel], env_prefix: str | None) -> list[str]:
    head = "| setting | environment variable | type | default | description |"
    if env_prefix is None:
        head = "| field | type | default | description |"
    rows = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for name, info in model.model_fields.items():
        if not info.description:
            raise ValueError(f"{model.__name__}.{name} has no description")
        cells = [f"`{name}`"]
        if env_prefix is not None:
            cells.append(f"`{env_prefix}{name.upper()}`")
        cells += [
            _type_name(info.annotation) + _constraints(info),
            _default(info),
            info.description,
        ]
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return rows


def render(settings: type[BaseSettings] = Settings, tier: type[BaseModel] = TierConfig) -> str:
    config = settings.model_config
    prefix = str(config.get("env_prefix", ""))
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated from tierpoint.config.Settings by `{REGENERATE}`: do not edit. -->",
        "",
        "Every tierpoint process (`tierpoint api`, `tierpoint worker`, `tierpoint migrate`) reads "
        "these settings. Each comes, first found wins, from:",
        "",
        f"1. the environment variable `{prefix}<NAME>` (case-insensitive);",
        "2. the TOML file named by `TIERPOINT_CONFIG_FILE` (default `./tierpoint.toml`), "
        "keys as in the first column;",
        "3. the default.",
        "",
        "Values in the environment are parsed as their type: a list (`TIERPOINT_TIERS`) as "
        "JSON, a duration as seconds or ISO 8601 (`PT10M`). S3 credentials are not settings: "
        "they come from the standard AWS chain (environment, profile, instance or pod role).",
        "",
        "## Settings",
        "",
        *_rows(settings, prefix),
        "",
        "## Tier",
        "",
        "Each entry of `tiers` (`[[tiers]]` in TOML, an object of the JSON list in "
        "`TIERPOINT_TIERS`). POSIX tiers (`local`, `shared`) need `root`, S3 tiers need "
        "`bucket`; the S3 fields are ignored for POSIX tiers.",
        "",
        *_rows(tier, None),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tierpoint.config_reference",
        description="Rewrite the configuration reference from the settings model.",
    )
    parser.add_argument("path", nargs="?", type=Path, default=DOC, help=f"default: {DOC.name}")
    path: Path = parser.parse_args(argv).path
    path.write_text(render())
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
