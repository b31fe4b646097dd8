"""The cost table of docs/architecture.md says what the cost model computes: its formulas and
every number in its lifecycle and catalog rows, so a stale doc fails here. (The model itself is
held to real lifecycles by test_cost_bounds.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import cost_model

DOC = Path(__file__).parents[2] / "docs" / "architecture.md"
NUMBER = re.compile(r"\d[\d,]*")


def cost_table() -> tuple[list[str], dict[str, list[str]]]:
    """The header cells and the rows (by their first cell) of the table under "Cost per
    checkpoint"."""
    text = DOC.read_text()
    section = text[text.index("## Cost per checkpoint") :]
    section = section[: section.index("\n## ", 1)]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert len(lines) > 2, "no table in the cost section"

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]

    header, rows = cells(lines[0]), [cells(line) for line in lines[2:]]
    return header, {r[0]: r for r in rows}


def numbers(cell: str) -> list[int]:
    return [int(n.replace(",", "")) for n in NUMBER.findall(cell)]


def shape(heading: str) -> cost_model.Checkpoint:
    """A column's checkpoint, from its heading ("S=10,000, N=2", T=3 unless it says otherwise)."""
    found = dict(re.findall(r"\b([SNT])=(\d[\d,]*)", heading))
    shards, nodes = (int(found[k].replace(",", "")) for k in ("S", "N"))
    tiers = int(found.get("T", "3"))
    return cost_model.Checkpoint(cost_model.spread(shards, nodes), tiers=tiers)


HEADER, ROWS = cost_table()
COLUMNS = [(i, h) for i, h in enumerate(HEADER) if "S=" in h]


def test_the_table_has_the_rows_and_columns_the_model_covers() -> None:
    assert set(cost_model.FORMULAS) <= set(ROWS)
    assert [h for _, h in COLUMNS] == [
        "demo (S=4, N=2, T=3 → b=2)",
        "S=1000, N=2",
        "S=5,000, N=2",
    ]


@pytest.mark.parametrize("row", sorted(cost_model.FORMULAS))
def test_the_formulas_are_the_models(row: str) -> None:
    formula = ROWS[row][1]
    for part in cost_model.FORMULAS[row]:
        assert f"`{part}`" in formula, (row, part)


@pytest.mark.parametrize(("column", "heading"), COLUMNS, ids=[h for _, h in COLUMNS])
def test_the_numbers_are_the_models(column: int, heading: str) -> None:
    model = shape(heading)
    for b in numbers("".join(re.findall(r"b=\d+", heading))):
        assert b == model.batches, heading

    activities = ROWS["lifecycle activities"][column]
    assert numbers(activities)[0] == model.activities, activities
    for b in re.findall(r"b=(\d+)", activities):
        assert int(b) == model.batches, activities

    history = numbers(ROWS["lifecycle history events"][column])
    low, high, *measured = history
    assert (low, high) == (model.history_events_min, model.history_events_max), history
    assert measured, "the doc gives no measured history count"
    assert all(low <= m <= high for m in measured), history

    assert numbers(ROWS["catalog rows written"][column]) == [model.catalog_rows]
    assert numbers(ROWS["catalog events `E`"][column]) == [model.catalog_events]
