"""The workers run workflows outside Temporal's sandbox (apps/worker.py says why), so what the
sandbox would refuse at run time is refused here, in the source of every workflow module: no clock
but the workflow's, no randomness, no I/O, no threads. The import contracts keep the catalog, the
stores and the I/O libraries out of workflows/; the replay test replays every committed history
under the sandbox."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
WORKFLOWS = ROOT / "workflows"
# What workflows may import besides temporalio (the `workflows-deterministic` contract): their
# code runs inside workflows too. They name `datetime` and `Path` as the types of fields, so only
# the calls are checked there.
IMPORTED = sorted(
    [
        *(ROOT / "tierpoint" / "contract").rglob("*.py"),
        ROOT / "tierpoint" / "states.py",
        ROOT / "tierpoint" / "tier_config.py",
    ]
)

# Modules that give a workflow a clock, randomness, I/O, processes or threads of its own.
FORBIDDEN_MODULES = frozenset(
    {
        "time",
        "random",
        "secrets",
        "uuid",
        "os",
        "io",
        "pathlib",
        "shutil",
        "tempfile",
        "socket",
        "select",
        "selectors",
        "signal",
        "subprocess",
        "threading",
        "multiprocessing",
        "concurrent",
        "urllib",
        "http",
        "logging",
    }
)
# From datetime only the durations: `datetime.now()` and `date.today()` are wall clocks.
DATETIME_ALLOWED = frozenset({"timedelta"})
# Calls that read a clock or do I/O whatever they were imported as.
FORBIDDEN_CALLS = frozenset(
    {
        "open",
        "print",
        "input",
        "now",
        "utcnow",
        "today",
        "to_thread",
        "run_in_executor",
        "get_event_loop",
        "get_running_loop",
        "create_subprocess_exec",
        "create_subprocess_shell",
        "open_connection",
        "sandbox_unrestricted",
    }
)


def _violations(source: str, *, imports: bool = True) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not imports and isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES | {"datetime"}:
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            root = node.module.split(".")[0]
            names = {alias.name for alias in node.names}
            if root in FORBIDDEN_MODULES or (root == "datetime" and names - DATETIME_ALLOWED):
                found.append(f"line {node.lineno}: from {node.module} import {sorted(names)}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            # The workflow's own clock: `workflow.now()`, `workflow.time()`.
            own = (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "workflow"
            )
            if name in FORBIDDEN_CALLS and not own:
                found.append(f"line {node.lineno}: {name}()")
    return found


@pytest.mark.parametrize("module", sorted(WORKFLOWS.glob("*.py")), ids=lambda p: p.name)
def test_a_workflow_module_calls_no_clock_randomness_or_io(module: Path) -> None:
    assert _violations(module.read_text()) == []


@pytest.mark.parametrize("module", IMPORTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_what_workflows_import_calls_no_clock_randomness_or_io(module: Path) -> None:
    assert _violations(module.read_text(), imports=False) == []


@pytest.mark.parametrize(
    "source",
    [
        "import time\n",
        "from os import path\n",
        "from datetime import datetime\n",
        "import uuid\nx = uuid.uuid4()\n",
        "async def f():\n    return datetime.now()\n",
        "async def f():\n    await asyncio.to_thread(g)\n",
        "def f():\n    open('x')\n",
        "with workflow.unsafe.sandbox_unrestricted():\n    pass\n",
    ],
)
def test_the_rules_catch_what_the_sandbox_would(source: str) -> None:
    assert _violations(source) != []


def test_the_rules_let_a_workflows_own_clock_and_timers_through() -> None:
    source = (
        "from datetime import timedelta\n"
        "async def f():\n"
        "    await asyncio.sleep(1)\n"
        "    return workflow.now(), workflow.time(), timedelta(seconds=1)\n"
    )
    assert _violations(source) == []
