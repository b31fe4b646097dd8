"""The glossary is the code's vocabulary (docs/architecture.md, "Glossary"): one word per concept
in every layer. A checkpoint's copy on one tier is a "tier copy" (never a "marker"); "live" meant
five things and is said as what it means (a node not lost, a node serving its queue, a lease
active, a checkpoint not deleted, a copy not expired); "holder" is the node holding a peer copy,
and a lease's is its "owner". Read off the identifiers of every package and of the client."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from tierpoint_client.models import Lease as ClientLease

from api.schemas.leases import CreateLease, Lease
from api.schemas.restores import StartRestore
from tierpoint.catalog.holds.leases import LeaseView
from tierpoint.catalog.models import RestoreLease
from tierpoint.contract.lifecycle import Batch
from tierpoint.services.restore import LeaseRequest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("tierpoint", "api", "activities", "workflows", "apps", "client/tierpoint_client")
# Words no identifier may hold, and the word that replaced each.
BANNED = {
    "marker": "tier copy",
    "markers": "tier copies",
    "live": "not lost, serving, active, undeleted or unexpired",
    "checkpointtier": "TierCopy",
}
# Names that are not ours to choose: S3's own keyword arguments.
FOREIGN = {"PartNumberMarker", "NextPartNumberMarker"}


def _words(identifier: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", identifier)
    words = [w for w in spaced.lower().split("_") if w]
    return [*words, identifier.lower()]


def _identifiers(tree: ast.AST) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.keyword):
            names = [] if node.arg is None else [node.arg]
        elif isinstance(node, ast.alias):
            names = [*node.name.split("."), *([node.asname] if node.asname else [])]
        out += [(getattr(node, "lineno", 0), n) for n in names]
    return out


def banned_in(source: str, path: str) -> list[str]:
    found = []
    for line, name in _identifiers(ast.parse(source)):
        if name in FOREIGN:
            continue
        banned = [w for w in _words(name) if w in BANNED]
        if banned:
            found.append(f"{path}:{line}: {name} (say: {BANNED[banned[0]]})")
    return found


def test_no_identifier_uses_a_banned_synonym() -> None:
    found = []
    for folder in SOURCES:
        for file in sorted((ROOT / folder).rglob("*.py")):
            if "build" in file.relative_to(ROOT).parts:
                continue
            found += banned_in(file.read_text(), str(file.relative_to(ROOT)))
    assert not found, "identifiers that use a word the glossary replaced:\n" + "\n".join(found)


def test_the_scan_catches_each_banned_word() -> None:
    module = (
        "def ensure_markers(marker): pass\n"
        "live = live_nodes()\n"
        "from tierpoint.catalog.models import CheckpointTier\n"
        "x.lock_Marker(alive=1, deliver=2, long_lived=3)\n"
    )
    found = sorted(f.split(": ", 1)[1].split(" ", 1)[0] for f in banned_in(module, "m.py"))
    assert found == sorted(
        ["ensure_markers", "marker", "live", "live_nodes", "CheckpointTier", "lock_Marker"]
    )


def _fields(cls: type) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    if hasattr(cls, "model_fields"):
        return set(cls.model_fields)
    return {c.key for c in cls.__mapper__.column_attrs}  # type: ignore[attr-defined]


def test_a_lease_has_an_owner_and_a_peer_copy_a_holder() -> None:
    leases = [RestoreLease, LeaseView, LeaseRequest, CreateLease, Lease, StartRestore, ClientLease]
    for cls in leases:
        assert "holder" not in _fields(cls), f"{cls.__qualname__}: a lease's is its owner"
        assert "owner" in _fields(cls), cls.__qualname__
    assert "holder" in _fields(Batch)
