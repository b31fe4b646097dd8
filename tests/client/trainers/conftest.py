"""The trainers' own loops (torchtitan, Lightning Fabric) run in `.venv-trainers`, which
bootstrap.py builds beside `.venv-torch` (`python3 bootstrap.py test` or `trainers-venv`)."""

from __future__ import annotations

import pytest

from tests.client.trainers.trainer import TRAINERS_PYTHON, TRAINERS_VENV


@pytest.fixture(scope="module", autouse=True)
def _trainers_venv() -> None:
    if not TRAINERS_PYTHON.exists():
        pytest.skip(
            f"{TRAINERS_VENV.name}/ (torchtitan, triton, Lightning) was not built: "
            "`python3 bootstrap.py trainers-venv` builds it from PyPI, and `python3 bootstrap.py "
            "test` does so first; it skips these tests only where the packages cannot be installed"
        )
