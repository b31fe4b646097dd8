"""docs/configuration.md is generated from the settings model and must be regenerated when the
model changes; the environment variable names it documents are the ones Settings reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import Field

from tierpoint.config import Settings
from tierpoint.config_reference import REGENERATE, main, render
from tierpoint.tier_config import TierConfig

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"


def test_the_committed_reference_is_current() -> None:
    assert DOC.read_text() == render(), (
        f"docs/configuration.md is stale: regenerate it with `.venv/bin/{REGENERATE}` "
        "and commit the result"
    )


def test_a_new_setting_makes_the_committed_reference_stale() -> None:
    class Changed(Settings):
        new_setting: int = Field(default=1, description="A setting the reference lacks.")

    changed = render(Changed)
    assert changed != DOC.read_text()
    assert "`TIERPOINT_NEW_SETTING`" in changed


def test_a_setting_without_a_description_is_refused() -> None:
    class Undocumented(TierConfig):
        undocumented: int = 0

    with pytest.raises(ValueError, match="undocumented has no description"):
        render(tier=Undocumented)


def test_the_generator_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "configuration.md"
    main([str(out)])
    assert out.read_text() == render()


def test_help_is_help_not_a_file_named_help(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert "configuration reference" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_every_documented_variable_is_read_by_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no tierpoint.toml
    rows = re.findall(r"^\| `(\w+)` \| `(TIERPOINT_\w+)` \|", DOC.read_text(), re.M)
    assert {name for name, _ in rows} == set(Settings.model_fields)
    values = {str: "x-1", int: "7", float: "0.5", bool: "true"}
    checked = 0
    for name, var in rows:
        kind = Settings.model_fields[name].annotation
        if kind not in values:
            continue
        monkeypatch.setenv(var, values[kind])
        assert Settings().model_dump()[name] == kind(values[kind]), var
        checked += 1
    assert Settings().log_json is True
    monkeypatch.setenv("TIERPOINT_TIERS", '[{"name": "t", "kind": "shared", "root": "/r"}]')
    monkeypatch.setenv("TIERPOINT_RETENTION_SWEEP_INTERVAL", "PT1M")
    assert Settings().tier_names() == ["t"]
    assert Settings().retention_sweep_interval.total_seconds() == 60
    assert checked >= 10
