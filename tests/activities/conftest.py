"""The activities' tests run each activity in the test's process (temporalio's
ActivityEnvironment) on the module's catalog and on files: no Temporal server, no S3 (the catalog
tier). A test here that needs either builds on `services`, as tests/conftest.py's `settings`
does."""

from __future__ import annotations

import pytest

from tierpoint.config import Settings


@pytest.fixture
def settings(catalog_settings: Settings) -> Settings:
    return catalog_settings
