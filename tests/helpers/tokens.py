"""Access tokens for tests, made in the test's own catalog as `tierpoint token create` makes them:
an admin token for clients written without auth in mind, named tokens whose name a test expects
as the actor of an event, and scoped ones for the access tests."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta

from fastapi import FastAPI
from sqlalchemy import Engine

from tierpoint.catalog.engine import make_sync_engine, sync_sessions
from tierpoint.catalog.token import tokens

# The default test clients' admin tokens: `test-admin-<random>`, one per client.
TEST_ADMIN = "test-admin"


def actor_name(actor: str | None) -> str | None:
    """An event's actor, with any default test client's token shown as `test-admin`."""
    if actor is not None and actor.startswith(TEST_ADMIN + "-"):
        return TEST_ADMIN
    return actor


def create_token(
    catalog: Engine | str,
    name: str | None = None,
    scopes: Sequence[str] = ("admin",),
    expires_in: timedelta | None = None,
) -> str:
    """A new token's secret; a token of the same name is replaced."""
    engine = make_sync_engine(catalog, pool_size=1) if isinstance(catalog, str) else catalog
    try:
        with sync_sessions(engine)() as session:
            new = tokens.create_token(
                session,
                name or f"test-{uuid.uuid4().hex[:12]}",
                list(scopes),
                expires_in,
                replace=True,
            )
            session.commit()
            return new.secret
    finally:
        if isinstance(catalog, str):
            engine.dispose()


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def as_token(
    catalog: Engine | str, name: str, scopes: Sequence[str] = ("admin",)
) -> dict[str, str]:
    """Headers of a request made with a token named `name`."""
    return bearer(create_token(catalog, name, scopes))


async def app_admin_token(app: FastAPI) -> str:
    """An admin token in the catalog of a started app (its lifespan has run)."""
    sessions = app.state.tierpoint.sessions
    async with sessions() as session:
        new = await session.run_sync(
            lambda s: tokens.create_token(
                s, f"{TEST_ADMIN}-{uuid.uuid4().hex[:12]}", ["admin"], None
            )
        )
        await session.commit()
    secret: str = new.secret
    return secret
