"""workflows/registry.py lists every workflow the package defines: a workflow left off the list
would be served by no worker (its starts would wait on the shared queue for good) and replayed
against no recorded history, so a change that breaks its determinism would go unseen."""

from __future__ import annotations

import importlib
import pkgutil

from temporalio import workflow

import workflows
from workflows.registry import WORKFLOWS


def _defined() -> dict[str, type]:
    """Every class of the package with a workflow definition, by its workflow name."""
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(workflows.__path__):
        module = importlib.import_module(f"{workflows.__name__}.{info.name}")
        for value in vars(module).values():
            if not isinstance(value, type) or value.__module__ != module.__name__:
                continue
            definition = workflow._Definition.from_class(value)
            if definition is not None:
                assert definition.name is not None, f"{value.__name__} has no workflow name"
                assert definition.name not in found, f"two workflows named {definition.name}"
                found[definition.name] = value
    return found


def test_every_workflow_the_package_defines_is_registered_once() -> None:
    defined = _defined()
    registered = [str(workflow._Definition.must_from_class(w).name) for w in WORKFLOWS]
    assert len(set(registered)) == len(registered), registered
    assert set(registered) == set(defined), (
        f"defined, not registered: {sorted(set(defined) - set(registered))}; "
        f"registered, not defined here: {sorted(set(registered) - set(defined))}"
    )
