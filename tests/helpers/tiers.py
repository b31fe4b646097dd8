"""Tiers of tests: what a test needs decides how fast it can run.

- `pure`: nothing outside the pytest process: no service, no child process (an in-process
  loopback server on a thread is part of the process).
- `catalog`: a real Postgres with the real migrations and nothing else (Postgres's own client
  programs, such as `pg_dump`, included).
- `full_stack`: Temporal, workers, S3, or any process the test starts.

Each test's tier is derived at collection from the fixtures it requests (directly or through
other fixtures): the session fixtures that start a service are listed in SERVICE_FIXTURES with the
tier they imply, so a new fixture built on them is classified without being listed. A test that
starts a process itself is marked `full_stack` by hand (a module's `pytestmark`): derivation
cannot see it. A mark that claims less than the fixtures need is refused at collection.

Two checks keep the marks honest while the tests run. A service fixture asked for by a test whose
tier does not allow it refuses to start (`starting`: a fixture requested at run time, which
derivation cannot see). And an audit hook watches every test of the pure and catalog tiers:
a process started during its setup, call or teardown, other than by a service fixture it is
allowed, is refused on the spot and fails that phase, naming the command (`watching`).
"""

from __future__ import annotations

import ast
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

PURE, CATALOG, FULL_STACK = "pure", "catalog", "full_stack"
TIERS = (PURE, CATALOG, FULL_STACK)  # lightest first

# The session fixtures that start a service, and the tier a test that uses one belongs to.
SERVICE_FIXTURES = {
    "postgres_url": CATALOG,
    "temporal_address": FULL_STACK,
    "s3_server": FULL_STACK,
    "rgw": FULL_STACK,  # Ceph's RADOS Gateway, a second S3
    # A Postgres server of the test's own, which it stops and starts (tests/faults/).
    "dedicated_postgres": FULL_STACK,
}

# What a catalog test may run: Postgres's client programs, which start no server.
CATALOG_PROGRAMS = frozenset({"pg_dump", "psql"})

# The audit events of starting a process (subprocess, asyncio's subprocesses and multiprocessing
# all go through one of them).
_SYSTEM_EVENT = "os.system"
_SPAWN_EVENTS = frozenset(
    {"subprocess.Popen", "os.posix_spawn", "os.spawn", "os.exec", "os.fork", "os.forkpty"}
    | {_SYSTEM_EVENT}
)


class TierViolation(Exception):
    """A test did something its tier does not allow."""


def _rank(tier: str) -> int:
    return TIERS.index(tier)


def derive(item: pytest.Item) -> str:
    """The tier of `item`: its explicit tier mark, else the heaviest one its fixtures imply.
    Raises pytest.UsageError when an explicit mark claims less than the fixtures need."""
    used = {
        name: tier
        for name, tier in SERVICE_FIXTURES.items()
        if name in getattr(item, "fixturenames", ())
    }
    needed = max(used.values(), key=_rank, default=PURE)
    marked = {m.name for m in item.iter_markers() if m.name in TIERS}
    if not marked:
        return needed
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid} has more than one tier mark: {sorted(marked)}")
    (claimed,) = marked
    if _rank(claimed) < _rank(needed):
        culprits = ", ".join(sorted(n for n, t in used.items() if _rank(t) > _rank(claimed)))
        raise pytest.UsageError(
            f"{item.nodeid} is marked {claimed} but uses {culprits} ({needed}): drop the mark "
            "or the fixture"
        )
    return claimed


_TIER = pytest.StashKey[str]()


def mark(items: list[pytest.Item]) -> None:
    """Give every item exactly one tier mark (`-m pure`, `-m "pure or catalog"` select by it)."""
    for item in items:
        tier = derive(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(tier)
        item.stash[_TIER] = tier


def excludes_full_stack(markexpr: str) -> bool:
    """Whether `-m markexpr` deselects every full-stack test, whatever its other marks: only
    when the expression names nothing but tiers, and is false for a full-stack test."""
    names = set(re.findall(r"[A-Za-z_]\w*", markexpr)) - {"and", "or", "not"}
    rest = re.sub(r"[A-Za-z_]\w*|[()\s]", "", markexpr)
    if not markexpr.strip() or rest or not names <= set(TIERS):
        return False
    values = {tier: tier == FULL_STACK for tier in TIERS}
    # Only tier names, and/or/not and parentheses are left: a Python boolean expression.
    return not eval(markexpr, {"__builtins__": {}}, values)


def marked_full_stack(module: Path) -> bool:
    """Whether the test module marks itself full-stack as a whole (`pytestmark`, alone or in a
    list), read from its source without importing it."""
    source = module.read_text()
    if FULL_STACK not in source:
        return False
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            marks = node.value.elts if isinstance(node.value, ast.List) else [node.value]
            return any(isinstance(m, ast.Attribute) and m.attr == FULL_STACK for m in marks)
    return False


def tier_of(item: pytest.Item) -> str:
    return item.stash.get(_TIER, FULL_STACK)


@dataclass
class _Watch:
    """The test being run, and the processes it started that its tier does not allow."""

    item: str | None = None
    tier: str | None = None
    allowed: int = 0  # > 0 while a service fixture starts or stops its server
    seen: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


_watch = _Watch()


def _command(event: str, args: tuple[Any, ...]) -> tuple[str, str]:
    """(program, the command as shown) of an audit event that starts a process; a fork starts
    no program yet (its event's name)."""
    if event == "subprocess.Popen":
        executable, argv = args[0], args[1]
        single = isinstance(argv, (str, bytes, os.PathLike))
        words = [argv] if single else list(argv)
        program = executable if executable is not None else (words[0] if words else "?")
    elif event in ("os.posix_spawn", "os.exec"):
        program, words = args[0], list(args[1])
    elif event == "os.spawn":
        program, words = args[1], list(args[2])
    elif event == _SYSTEM_EVENT:
        words = [args[0] or "?"]
        program = os.fsdecode(words[0]).split(maxsplit=1)[0] if words[0] else "?"
    else:
        return event, event
    shown = " ".join(
        os.fsdecode(w) if isinstance(w, (bytes, os.PathLike)) else str(w) for w in words
    )
    return os.fsdecode(program), f"{event}: {shown[:200]}"


def _violation(nodeid: str | None, tier: str, seen: list[str]) -> TierViolation:
    return TierViolation(
        f"{nodeid} is a {tier} test: it may not start a process ({'; '.join(seen)}). A test "
        f"that starts processes is {FULL_STACK}: mark it with `pytest.mark.{FULL_STACK}`"
    )


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event not in _SPAWN_EVENTS:
        return
    tier = _watch.tier
    if tier is None or tier == FULL_STACK or _watch.allowed:
        return
    program, shown = _command(event, args)
    if tier == CATALOG and os.path.basename(program) in CATALOG_PROGRAMS:
        return
    with _watch.lock:
        _watch.seen.append(shown)
    # Refused on the spot, so that a mis-marked test never brings a stack up in the fast tier;
    # recorded too, in case the code under test catches the error.
    raise _violation(_watch.item, tier, [shown])


_installed = False


def install() -> None:
    """Add the audit hook once per process (hooks cannot be removed: it does nothing outside a
    watched test)."""
    global _installed
    if not _installed:
        sys.addaudithook(_audit)
        _installed = True


def _take() -> list[str]:
    with _watch.lock:
        seen, _watch.seen = _watch.seen, []
    return seen


@contextmanager
def watching(item: pytest.Item) -> Iterator[None]:
    """Run one phase of `item` under its tier's watch: a process its tier does not allow is
    refused when it starts (the audit hook), and fails the phase even if the code under test
    caught that refusal."""
    tier = tier_of(item)
    _watch.item, _watch.tier = item.nodeid, tier
    _take()
    try:
        yield
    except TierViolation:
        raise
    except BaseException as exc:
        seen = _take()
        if seen:
            raise _violation(item.nodeid, tier, seen) from exc
        raise
    finally:
        _watch.item = _watch.tier = None
    seen = _take()
    if seen:
        raise _violation(item.nodeid, tier, seen)


@contextmanager
def starting(fixture: str, what: str) -> Iterator[None]:
    """A service fixture starting its server: refused when the test that asked for it is of a
    lighter tier (a fixture requested at run time, which derivation cannot see); else the
    processes it starts are the service's, not the test's."""
    needed = SERVICE_FIXTURES[fixture]
    tier = _watch.tier
    if tier is not None and _rank(tier) < _rank(needed):
        raise TierViolation(
            f"{_watch.item} is a {tier} test and asked for {what} ({fixture}, {needed}): "
            f"request the fixture in the test's signature, or mark the test {needed}"
        )
    with serving():
        yield


@contextmanager
def serving() -> Iterator[None]:
    """Processes started or stopped inside belong to a service fixture (its start, its stop at
    the end of the session), whichever test is running."""
    with _watch.lock:
        _watch.allowed += 1
    try:
        yield
    finally:
        with _watch.lock:
            _watch.allowed -= 1
