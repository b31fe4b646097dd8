"""Where a dev stack keeps its data, logs, tier roots and facts, under one data dir."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from apps.devstack.facts import PID_FILE, STACK_ENV, STACK_JSON


@dataclass(frozen=True)
class StackPaths:
    data_dir: Path

    @property
    def postgres(self) -> Path:
        return self.data_dir / "postgres"

    @property
    def temporal_db(self) -> Path:
        return self.data_dir / "temporal.db"

    @property
    def logs(self) -> Path:
        return self.data_dir / "logs"

    @property
    def stack_json(self) -> Path:
        return self.data_dir / STACK_JSON

    @property
    def stack_env(self) -> Path:
        return self.data_dir / STACK_ENV

    @property
    def pid_file(self) -> Path:
        return self.data_dir / PID_FILE
