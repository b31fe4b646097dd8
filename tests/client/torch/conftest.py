"""Every test here runs DCP ranks in the torch venv that bootstrap.py builds."""

from __future__ import annotations

import pytest

from tests.client.torch.ranks import require_torch_venv


@pytest.fixture(scope="module", autouse=True)
def _torch_venv() -> None:
    require_torch_venv()
