"""What a copy's tier kind means to a reader is decided in one place, `tierpoint_client.sources`:
which class reads a copy and which copies a reader on a node may read. Every other module of the
client asks it, so a new way of reading, or a new kind of tier, is added there and nowhere else,
and the restore and the DCP reader cannot drift apart in how they read the same copy."""

from __future__ import annotations

import ast
from pathlib import Path

import tierpoint_client

CLIENT = Path(tierpoint_client.__file__).parent
KINDS = {"local", "shared", "peer", "s3"}

# module -> why it may compare a kind: the one place, and the tier the DCP writer writes to.
ALLOWED = {
    "sources/__init__.py": "the one place",
    "torch/_files.py": "local_tier: the first local tier of the config, where checkpoints go",
}


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {s for e in node.elts for s in _strings(e)}
    return set()


def _is_kind(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "kind") or (
        isinstance(node, ast.Name) and node.id == "kind"
    )


def kind_branches(source: str) -> list[int]:
    """The lines of `source` that compare a kind with a tier kind (`entry.kind == "s3"`,
    `kind in ("local", "shared")`, ...)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_kind(s) for s in sides) and any(_strings(s) & KINDS for s in sides):
                lines.append(node.lineno)
    return lines


def branching_modules(client: Path) -> dict[str, list[int]]:
    out = {}
    for path in sorted(client.rglob("*.py")):
        lines = kind_branches(path.read_text())
        if lines:
            out[path.relative_to(client).as_posix()] = lines
    return out


def test_only_the_sources_package_branches_on_a_tier_kind() -> None:
    found = branching_modules(CLIENT)
    assert set(found) <= set(ALLOWED), {m: found[m] for m in set(found) - set(ALLOWED)}


def test_the_one_place_is_where_the_kinds_are() -> None:
    # A module of ALLOWED that stopped branching must leave it, or a new branch there would
    # pass unnoticed; the one place names every kind a reader knows.
    found = branching_modules(CLIENT)
    assert set(found) == set(ALLOWED)
    source = (CLIENT / "sources" / "__init__.py").read_text()
    compared = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Compare)]
    named = {s for n in compared for side in (n.left, *n.comparators) for s in _strings(side)}
    assert named >= KINDS
