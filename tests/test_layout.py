"""The tests mirror the code: every module of the catalog, the activities and the workflows has its
tests in `tests/<its path>/test_<its name>.py`, so whoever changes a module knows which tests to
run (and which to read first). A package's `__init__` is no module of its own; a package whose
modules are private (`_name.py`, imported through the package alone) is tested as one module, in
`tests/<the package's parent>/test_<package>.py`.

Tests that meet a module through the API, a workflow or a fault stay where they are: the mirrored
module holds the tests that call the module's own functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIRRORED = ("tierpoint/catalog", "activities", "workflows")

# Modules whose mirrored test module is not written yet. The list only shrinks: a module listed
# here that gains its test module fails the check below until it leaves the list, and a new
# module can never join it without a review seeing it.
NOT_YET_MIRRORED: frozenset[str] = frozenset()

# Modules with no test module of their own, and why. Each reason is checked where it can be.
DECLARATIONS_ONLY = "declarations only: the dataclasses the reads fill, tested through those reads"
EXEMPT = {
    "tierpoint/catalog/reads/views.py": DECLARATIONS_ONLY,
    "tierpoint/catalog/reads/operator_views.py": DECLARATIONS_ONLY,
}


def mirror(module: Path) -> Path:
    """Where the tests of `module` (relative to the repository) live."""
    private = next((i for i, part in enumerate(module.parts) if part.startswith("_")), None)
    if private is not None and module.name != "__init__.py":
        package = Path(*module.parts[:private])
        return Path("tests") / package.parent / f"test_{package.name}.py"
    return Path("tests") / module.parent / f"test_{module.stem}.py"


def modules() -> list[Path]:
    return sorted(
        p.relative_to(ROOT)
        for root in MIRRORED
        for p in (ROOT / root).rglob("*.py")
        if p.name != "__init__.py"
    )


def test_every_module_has_its_mirrored_test_module() -> None:
    missing = [
        f"{m} (tests go in {mirror(m)})"
        for m in modules()
        if not (ROOT / mirror(m)).is_file() and str(m) not in NOT_YET_MIRRORED | EXEMPT.keys()
    ]
    assert not missing, "modules without their mirrored test module:\n" + "\n".join(missing)


def test_the_list_of_modules_not_yet_mirrored_only_shrinks() -> None:
    known = {str(m) for m in modules()}
    gone = sorted((NOT_YET_MIRRORED | EXEMPT.keys()) - known)
    assert not gone, f"listed but no longer a module (take them off the list): {gone}"
    done = sorted(m for m in NOT_YET_MIRRORED if (ROOT / mirror(Path(m))).is_file())
    assert not done, f"listed but their test module exists (take them off the list): {done}"


def test_a_module_exempt_as_declarations_declares_and_does_nothing() -> None:
    for name, why in EXEMPT.items():
        tree = ast.parse((ROOT / name).read_text())
        assert why != DECLARATIONS_ONLY or not [
            node.name
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        ], f"{name} has behaviour of its own now: give it its mirrored test module"


def test_a_private_module_is_tested_with_its_package() -> None:
    assert mirror(Path("tierpoint/catalog/models/_copies.py")) == Path(
        "tests/tierpoint/catalog/test_models.py"
    )
    assert mirror(Path("activities/copy.py")) == Path("tests/activities/test_copy.py")
    assert mirror(Path("tierpoint/catalog/tier_copy/machine.py")) == Path(
        "tests/tierpoint/catalog/tier_copy/test_machine.py"
    )
