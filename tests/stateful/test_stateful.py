"""The model-based test of the whole store: random interleavings of registrations (odd names,
unregistered files and symlinks beside the shards, hostile manifests), pins, quarantines, leases,
policy changes, retention runs, verification, bytes damaged, truncated or deleted behind the
store's back, reconciliation, deletes followed by the job writing the step again, a lost writer or
holder, and restores from every tier (while a holder of the copies read dies, while retention
expires the step), on the real stack with a peer tier of two copies on four nodes (machine.py),
each step followed by the checks of checks.py and checks_copies.py against the test's own model
(model.py). A run's timeline has its own machine on the same stack (timeline.py): saves, rollbacks
to valid and invalid targets, re-saved steps, verdicts, a fork and the child's saves, retention
runs, against its own model (timeline_model.py).

CI runs `knobs.EXAMPLES` examples of up to `knobs.STEPS` steps, derandomized (the same
sequences every run), and `knobs.TIMELINE_EXAMPLES` of `knobs.TIMELINE_STEPS` of the timeline's.
Longer: `TIERPOINT_STATEFUL_EXAMPLES=200 python3 bootstrap.py test --no-lint
tests/stateful`; other sequences: add `TIERPOINT_STATEFUL_SEED=N`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.helpers.tokens import create_token
from tests.stateful import knobs
from tests.stateful.base import MachineBase
from tests.stateful.machine import StatefulMachine
from tests.stateful.regressions import REGRESSIONS, Regression, replay
from tests.stateful.stack import Stack
from tests.stateful.timeline import TimelineMachine
from tierpoint.catalog.engine import make_sync_engine

# One example takes tens of seconds (it waits for lifecycles to settle): no deadline, and more
# than the default 600 s of pytest-timeout for the whole run.
RUN_TIMEOUT = 3600 * 6


@pytest.fixture(scope="module")
def machine(stateful_stack: Stack) -> Iterator[type[StatefulMachine]]:
    engine = make_sync_engine(stateful_stack.settings.database_url, pool_size=2)
    MachineBase.stack = stateful_stack
    MachineBase.engine = engine
    MachineBase.foreign_token = create_token(engine, "sf-foreign", ["train:zz-other-"])
    MachineBase.totals = {}
    yield StatefulMachine
    engine.dispose()


def report(started: float, stack: Stack) -> None:
    totals = dict(MachineBase.totals)
    examples = totals.pop("examples", 0)
    steps = totals.pop("steps", 0) - examples
    checks = sum(n for k, n in totals.items() if k.startswith("check:"))
    statuses = dict(sorted(stack.answers.by_status.items()))
    print(
        f"\nstateful: {examples} examples, {steps} steps, {checks} invariant checks, "
        f"{time.monotonic() - started:.0f} s; answers by status {statuses}"
    )
    for what, n in sorted(totals.items()):
        print(f"  {what}: {n}")


def _settings(examples: int, steps: int) -> settings:
    return settings(
        max_examples=examples,
        stateful_step_count=steps,
        derandomize=knobs.SEED is None,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.shrink] if knobs.SHRINK else [Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT)
def test_random_interleavings_keep_every_invariant(machine: type[StatefulMachine]) -> None:
    started = time.monotonic()
    factory = machine
    if knobs.SEED is not None:
        factory = seed(int(knobs.SEED))(machine)
    try:
        run_state_machine_as_test(
            factory,
            settings=_settings(knobs.EXAMPLES, knobs.STEPS),
        )
    finally:
        report(started, machine.stack)


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT)
def test_timeline_interleavings_keep_every_invariant(machine: type[StatefulMachine]) -> None:
    """The timeline's own machine (timeline.py) on the same stack."""
    started = time.monotonic()
    MachineBase.totals = {}
    factory: type[TimelineMachine] = TimelineMachine
    if knobs.SEED is not None:
        factory = seed(int(knobs.SEED))(TimelineMachine)
    try:
        run_state_machine_as_test(
            factory,
            settings=_settings(knobs.TIMELINE_EXAMPLES, knobs.TIMELINE_STEPS),
        )
    finally:
        report(started, machine.stack)


@pytest.mark.parametrize("case", REGRESSIONS, ids=lambda r: r.name)
def test_found_sequence_keeps_every_invariant(
    machine: type[StatefulMachine], case: Regression, request: pytest.FixtureRequest
) -> None:
    if case.known_bug is not None:
        # A product bug found here and not fixed yet: the sequence must fail until it is.
        request.node.add_marker(pytest.mark.xfail(reason=case.known_bug, strict=True))
    replay(machine, case.steps)
