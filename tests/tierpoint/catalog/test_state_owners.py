"""One owner per state machine: no module but `tier_copy/machine.py` writes a tier copy's state
(or adds or removes a tier copy), none but `replica/machine.py` writes a replica's state (or
adds one), and none but `stripe/machine.py` a stripe's. Read off the source of every package
of the project, so a writer added anywhere, in SQLAlchemy, in raw SQL or on an ORM row, fails
here."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("tierpoint", "api", "activities", "workflows", "apps")
OWNERS = {
    "tier copy": "tierpoint/catalog/tier_copy/machine.py",
    "replica": "tierpoint/catalog/replica/machine.py",
    "stripe": "tierpoint/catalog/stripe/machine.py",
}
# The ORM classes (and their tables) of each machine.
CLASSES = {
    "tier copy": ("TierCopy", "checkpoint_tier"),
    "replica": ("Replica", "replica"),
    "stripe": ("Stripe", "stripe"),
}
SQL_WRITE = re.compile(r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+(\w+)", re.IGNORECASE)


@dataclass(frozen=True)
class Write:
    machine: str
    path: str
    line: int
    what: str


def _machine_of(node: ast.expr, tables: dict[str, str]) -> str | None:
    """Which machine's rows an expression names: its ORM class, its `__table__`, or a name
    bound to that table in the module."""
    src = ast.unparse(node)
    for machine, (cls, _) in CLASSES.items():
        if re.fullmatch(rf"({cls}|{cls}\.__table__|cast\(Table, {cls}\.__table__\))", src):
            return machine
    return tables.get(src)


def _sets_state(call: ast.Call) -> bool:
    """Whether a `.values(...)` or `.on_conflict_do_update(set_=...)` call writes `state`."""
    args = [*call.args, *(k.value for k in call.keywords if k.arg in (None, "set_"))]
    if any(k.arg == "state" for k in call.keywords):
        return True
    return any(
        isinstance(a, ast.Dict)
        and any(isinstance(k, ast.Constant) and k.value == "state" for k in a.keys)
        for a in args
    )


def _update_of(chain: ast.expr) -> ast.Call | None:
    """The `update(...)` call a statement's method chain starts from, if any."""
    while isinstance(chain, ast.Call | ast.Attribute):
        if isinstance(chain, ast.Call):
            if ast.unparse(chain.func) == "update" and chain.args:
                return chain
            chain = chain.func
        else:
            chain = chain.value
    return None


def writes_in(source: str, path: str) -> list[Write]:
    """Every write of a tier copy's or a replica's state in a module's source."""
    tree = ast.parse(source)
    tables: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            machine = _machine_of(node.value, {})
            if machine is not None and "__table__" in ast.unparse(node.value):
                tables[ast.unparse(node.targets[0])] = machine
    out: list[Write] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("values", "on_conflict_do_update")
            and _sets_state(node)
        ):
            root = _update_of(node.func.value)
            machine = _machine_of(root.args[0], tables) if root is not None else None
            if machine is not None:
                out.append(Write(machine, path, node.lineno, "sets its state"))
        if isinstance(node, ast.Call) and ast.unparse(node.func) in (
            "insert",
            "pg_insert",
            "delete",
        ):
            machine = _machine_of(node.args[0], tables) if node.args else None
            if machine is not None:
                out.append(Write(machine, path, node.lineno, f"{ast.unparse(node.func)}s rows"))
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == "state":
                    out.append(Write("either", path, node.lineno, "assigns .state on a row"))
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for verb, table in SQL_WRITE.findall(node.value):
                for machine, (_, name) in CLASSES.items():
                    if table.lower() == name:
                        out.append(Write(machine, path, node.lineno, f"SQL {verb.upper()}"))
    return out


def _project_writes() -> list[Write]:
    found = []
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            rel = str(file.relative_to(ROOT))
            found += writes_in(file.read_text(), rel)
    return found


def test_only_each_machine_writes_its_state() -> None:
    strays = [
        f"{w.path}:{w.line}: {w.what} of a {w.machine}"
        for w in _project_writes()
        if w.machine == "either" or w.path != OWNERS[w.machine]
    ]
    assert not strays, "a state written outside its machine's module:\n" + "\n".join(strays)


def test_each_machine_does_write_its_state() -> None:
    """The scan sees the owners' own writes, so a scan that sees nothing cannot pass the test
    above by accident."""
    seen = {(w.machine, w.path) for w in _project_writes()}
    assert {(m, p) for m, p in OWNERS.items()} <= seen


def test_the_scan_sees_every_way_to_write_a_state() -> None:
    module = """
from sqlalchemy import update, insert, delete, text
_t = cast(Table, Replica.__table__)
def a(s): s.execute(update(TierCopy).where(TierCopy.tier == "x").values(state="failed"))
def b(s): s.execute(update(_t).values({"state": "lost"}))
def c(s): s.execute(insert(TierCopy).values(checkpoint_id=1))
def d(s): s.execute(delete(TierCopy).where(TierCopy.tier == "x"))
def e(s): s.execute(text("UPDATE checkpoint_tier SET state = 'failed'"))
def f(s): s.execute(text("insert into replica (state) values ('lost')"))
def g(row): row.state = "failed"
def h(s): s.execute(update(TierCopy).values(key_layout="flat"))  # not the state
def i(s): s.execute(update(Replica).values(scrubbed_at=None))  # not the state
"""
    found = sorted((w.line, w.machine) for w in writes_in(module, "x.py"))
    assert found == [
        (4, "tier copy"),
        (5, "replica"),
        (6, "tier copy"),
        (7, "tier copy"),
        (8, "tier copy"),
        (9, "replica"),
        (10, "either"),
    ], found
