"""Failing sequences the stateful test found, shrunk by hand to what still fails, replayed as
explicit tests by test_stateful.py: each step, then every invariant, then the end-of-example
settle and check, exactly as Hypothesis runs them.

A sequence that fails because of a product bug not fixed yet names the bug (`known_bug`): its test
is a strict xfail, so it has to pass, and lose the mark, once the fix is in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.stateful.machine import StatefulMachine

Step = tuple[str, dict[str, Any]]


def manifest(names: list[str], *, extras: int = 0, on_b: bool = False) -> dict[str, Any]:
    return {
        "names": names,
        "sizes": [100] * 3,
        "on_b": [on_b] * 3,
        "null_crc": False,
        "extras": extras,
        "symlink_extra": False,
    }


@dataclass(frozen=True)
class Regression:
    name: str
    steps: tuple[Step, ...]
    # The product bug this sequence still fails on (None: fixed, it must pass).
    known_bug: str | None = None


REGRESSIONS = (
    Regression(
        "expiry_keeps_unregistered_files",
        (
            ("first_checkpoint", manifest(["a.bin"], extras=1)),
            ("revise_policy", {"which": "p", "spec": "tight"}),
            ("assign_policy", {"which": "p"}),
            ("register", manifest(["w.bin"])),
            ("settle", {}),
        ),
    ),
    # Found by the stateful test: a NUL in a corrupt-copy report's reason is not refused (404
    # before the copy exists, 500 from Postgres once it does).
    Regression(
        "nul_in_corrupt_copy_reason_refused",
        (
            ("first_checkpoint", manifest(["amp&k=v.bin"])),
            ("nul_report", {"pick": 0, "field": "reason"}),
        ),
    ),
    # Found by the stateful test: the node is declared lost while its seal runs (the replicas'
    # rows did not exist yet, so the declaration marked none); the seal then wrote them verified,
    # on a disk that is gone. Timing-dependent here; tests/tierpoint/catalog/replica/test_machine.py
    # pins it.
    Regression(
        "node_lost_during_seal_leaves_no_verified_replica",
        (
            ("first_checkpoint", manifest(["pct%41.bin", "caf\u00e9.bin"], on_b=True)),
            ("node_lost", {}),
            ("settle", {}),
        ),
    ),
    Regression(
        "nul_in_corrupt_copy_path_refused",
        (
            ("first_checkpoint", manifest(["a.bin"])),
            ("settle", {}),
            ("nul_report", {"pick": 0, "field": "path"}),
        ),
    ),
)


def replay(machine: type[StatefulMachine], steps: tuple[Step, ...]) -> None:
    state = machine()
    invariants: list[Callable[[], None]] = [
        state.unregistered_files_kept,
        state.latest_offers_registered_bytes,
    ]
    failed = True
    try:
        for check in invariants:
            check()
        for name, kwargs in steps:
            getattr(state, name)(**kwargs)
            for check in invariants:
                check()
        failed = False
    finally:
        if failed:
            state.cleanup()
        else:
            state.teardown()
