"""Fixtures of tests that drive the real API app (lifespan included) over httpx's ASGI transport,
on the module's own catalog and Temporal namespace. Conftest files that need them import them by
name (pytest then sees them as their own)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from api.app import create_app
from tests.helpers.api import NODE_A, NODE_B, running_client
from tests.helpers.services import Services
from tierpoint.catalog.engine import make_sync_engine
from tierpoint.catalog.node.registry import upsert_node
from tierpoint.config import Settings


@pytest.fixture(scope="module")
def catalog(migrated_url: str) -> Iterator[Engine]:
    engine = make_sync_engine(migrated_url, pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture
def nodes(catalog: Engine) -> tuple[str, str]:
    with Session(catalog) as s:
        known = set(s.scalars(text("SELECT id FROM node WHERE id IN ('node-a', 'node-b')")))
        for n in (NODE_A, NODE_B):
            # Workers of other tests in this module may own these rows: never rewrite them.
            if n not in known:
                upsert_node(s, n, {})
        s.commit()
    return NODE_A, NODE_B


@pytest.fixture(scope="module")
async def temporal(services: Services, temporal_namespace: str) -> Client:
    return await Client.connect(
        services.temporal_address,
        namespace=temporal_namespace,
        data_converter=pydantic_data_converter,
    )


@pytest.fixture
async def job(temporal: Client, catalog: Engine) -> AsyncIterator[str]:
    """A fresh job name; afterwards its lifecycle and retention workflows are terminated and its
    rows deleted (names that extend it included), so that workers and reconcilers of later tests
    in the module never see checkpoints whose shards exist nowhere."""
    name = f"job-{uuid.uuid4().hex[:12]}"
    yield name
    for prefix in ("checkpoint/", "retention/"):
        async for wf in temporal.list_workflows(f"WorkflowId STARTS_WITH '{prefix}{name}'"):
            with contextlib.suppress(Exception):
                await temporal.get_workflow_handle(wf.id).terminate("test finished")
    with catalog.begin() as conn:
        conn.execute(text("DELETE FROM job WHERE name LIKE :prefix"), {"prefix": name + "%"})


@pytest.fixture
async def client(settings: Settings, nodes: tuple[str, str]) -> AsyncIterator[httpx.AsyncClient]:
    async for c in running_client(create_app(settings)):
        yield c


@pytest.fixture
def policy_names(catalog: Engine) -> Iterator[list[str]]:
    """Names for policies a test creates; afterwards they are unassigned and deleted."""
    names: list[str] = []
    yield names
    with catalog.begin() as conn:
        for name in names:
            conn.execute(
                text(
                    "UPDATE job SET policy_id = NULL WHERE policy_id IN "
                    "(SELECT id FROM retention_policy WHERE name = :n)"
                ),
                {"n": name},
            )
            conn.execute(text("DELETE FROM retention_policy WHERE name = :n"), {"n": name})


@pytest.fixture
def new_policy(policy_names: list[str]) -> Iterator[Callable[[], str]]:
    def make() -> str:
        name = f"pol-{uuid.uuid4().hex[:10]}"
        policy_names.append(name)
        return name

    yield make
