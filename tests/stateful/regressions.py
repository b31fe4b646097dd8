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
        "again": False,
    }


@dataclass(frozen=True)
class Regression:
    name: str
    steps: tuple[Step, ...]
    # The product bug this sequence still fails on (None: fixed, it must pass).
    known_bug: str | None = None


REGRESSIONS = (
    # Found by the stateful test (a CI run, not shrunk): two of node a's three peers lost, so
    # step 1's second peer copy (`peer.2`) fails and cannot be made again on the one live node
    # left, which holds its first peer copy (never two copies on one node); the tightened policy
    # then expires that first copy, which frees the node: the expiry asks for `peer.2` again.
    Regression(
        "second_peer_copy_missing_after_two_losses_and_policy_changes",
        (
            (
                "first_checkpoint",
                {
                    "null_crc": False,
                    "on_b": [False, True, True],
                    "again": False,
                    "sizes": [848, 1471, 3600],
                    "symlink_extra": False,
                    "extras": 0,
                    "names": ["café.bin", "w.bin"],
                },
            ),
            ("holder_lost", {"which": 0}),
            ("node_lost", {}),
            ("lift", {"pick": 23, "whole": True}),
            ("lift", {"pick": 4, "whole": True}),
            ("lease", {"pick": 23}),
            ("lease", {"pick": 31}),
            ("delete_and_register_again", {"force": False, "pick": 47, "same_size": False}),
            ("assign_policy", {"which": "p"}),
            ("assign_policy", {"which": "p"}),
            (
                "register",
                {
                    "again": False,
                    "extras": 1,
                    "names": ["sp ace.bin", "deep/er/nest.bin"],
                    "null_crc": False,
                    "on_b": [False, True, False],
                    "sizes": [297, 452, 121],
                    "symlink_extra": True,
                },
            ),
            ("delete_and_register_again", {"force": True, "pick": 21, "same_size": False}),
            ("lease", {"pick": 21}),
            ("forbidden", {"malformed": True, "pick": 49, "which": ("operate", "revise")}),
            ("revise_policy", {"spec": "tight", "which": "p"}),
            (
                "register",
                {
                    "again": False,
                    "extras": 0,
                    "names": ["sp ace.bin"],
                    "null_crc": False,
                    "on_b": [False, True, True],
                    "sizes": [297, 452, 121],
                    "symlink_extra": False,
                },
            ),
        ),
    ),
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
    # Found by the stateful test with the peer tier: the second writer, which was to hold the
    # first's copy on `peer`, lost while the lifecycle still placed the copies. Either the copy
    # to it had not begun (never told, never made again: one copy short for good) or the copy
    # made again landed where the lifecycle then put `peer.2` (two copies on one node). Timing
    # decides which; tests/faults/test_holder_lost_in_flight.py pins both.
    Regression(
        "writer_lost_while_its_peer_copies_are_placed",
        (
            ("first_checkpoint", manifest(["amp&k=v.bin", "plus+1.bin", "w.bin#x"])),
            ("node_lost", {}),
            ("settle", {}),
        ),
    ),
    # Found by the stateful test: a step deleted with force while its lifecycle ran and
    # registered again joined the deleted checkpoint's run and stayed pending on every tier
    # (when that run had not ended yet; tests/api/test_delete_in_flight.py pins it); or, when
    # the old seal read the job's new files, their identity was recorded and the old
    # checkpoint's delete removed them (tests/workflows/test_delete_after_a_failed_seal.py).
    Regression(
        "deleted_in_flight_and_registered_again",
        (
            ("first_checkpoint", manifest(["a.bin", "w.bin"])),
            ("delete_and_register_again", {"pick": 0, "force": True, "same_size": False}),
            ("settle", {}),
        ),
    ),
    # Found by the stateful test: registered again one byte longer within a second of a read of
    # the old copy, the new copy was found "damaged" by the data endpoint's kept listing and the
    # checkpoint lost (tests/tierpoint/test_data_endpoint_step_again.py pins it).
    Regression(
        "registered_again_within_the_endpoint_listing",
        (
            ("first_checkpoint", manifest(["amp&k=v.bin", "plus+1.bin"])),
            ("settle", {}),
            ("delete_and_register_again", {"pick": 0, "force": True, "same_size": False}),
            ("delete_and_register_again", {"pick": 0, "force": True, "same_size": False}),
            ("settle", {}),
        ),
    ),
    # Found by the restore rule's check: the fallback read a copy quarantined on its tier.
    Regression(
        "fallback_skips_a_quarantined_copy",
        (
            ("first_checkpoint", manifest(["a.bin"])),
            ("settle", {}),
            ("quarantine", {"pick": 0, "tier": "peer.2", "scope": "operate"}),
            ("flip_byte", {"pick": 0, "tier": "peer", "which": 0}),
            ("restore", {"tier": "peer", "fallback": True}),
        ),
    ),
)


def replay(machine: type[StatefulMachine], steps: tuple[Step, ...]) -> None:
    state = machine()
    invariants: list[Callable[[], None]] = [
        state.unregistered_files_kept,
        state.latest_offers_registered_bytes,
        state.acknowledged_files_kept,
        state.peer_copies_on_distinct_live_nodes,
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
