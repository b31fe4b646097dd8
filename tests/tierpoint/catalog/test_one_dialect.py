"""The catalog is written in one dialect, sync: each fact once, as a function of a `Session`. The
API calls it through `AsyncSession.run_sync`, a worker in a thread; only those doors (the
engine's bridges onto the event loop) are coroutines, so an async copy of a fact cannot creep
back in beside its sync one."""

from __future__ import annotations

import ast
from pathlib import Path

import tierpoint.catalog

CATALOG = Path(tierpoint.catalog.__file__).parent

# module -> the coroutines it may define, by qualified name: the bridges, nothing else.
BRIDGES = {
    "engine": {"Transact.__call__", "transact_async.run", "transact_in_thread.run", "ping"},
    "migrate": {"check_schema_async"},
}


def coroutines(source: str) -> set[str]:
    """Qualified names of the `async def`s in `source`."""
    found: set[str] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if isinstance(child, ast.AsyncFunctionDef):
                    found.add(name)
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def async_outside_bridges(catalog: Path) -> dict[str, set[str]]:
    """Per catalog module, the coroutines it defines that are not bridges."""
    out = {}
    for path in sorted(catalog.glob("*.py")):
        extra = coroutines(path.read_text()) - BRIDGES.get(path.stem, set())
        if extra:
            out[path.stem] = extra
    return out


def test_the_catalog_has_no_coroutines_but_its_bridges() -> None:
    assert async_outside_bridges(CATALOG) == {}


def test_the_bridges_exist() -> None:
    # A bridge renamed or removed must leave this list too, or the list would allow a new
    # coroutine of that name unnoticed.
    for module, names in BRIDGES.items():
        assert coroutines((CATALOG / f"{module}.py").read_text()) == names


def test_an_async_catalog_function_is_found() -> None:
    # The scanner itself: nested and top-level coroutines are both seen, a sync one is not.
    source = (
        "async def read(s): ...\n"
        "def f():\n    async def inner(): ...\n"
        "class C:\n    def g(self): ...\n"
    )
    assert coroutines(source) == {"read", "f.inner"}
