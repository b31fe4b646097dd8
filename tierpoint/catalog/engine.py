"""Engines and sessions for the catalog. One DSN form, `postgresql+psycopg://`, serves both the
async engine (API) and the sync engine (workers' activities, which run in threads).

Statement parameters are kept out of error messages: a failed batch insert would otherwise carry
thousands of rows into logs and into Temporal's activity failure (which then exceeds its size
limit and loses the actual cause)."""

from __future__ import annotations

from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker


def normalize_url(url: str) -> str:
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_async_engine(url: str, pool_size: int = 10) -> AsyncEngine:
    return create_async_engine(
        normalize_url(url),
        pool_size=pool_size,
        max_overflow=20,
        pool_pre_ping=True,
        hide_parameters=True,
    )


def make_sync_engine(url: str, pool_size: int = 8) -> Engine:
    return create_engine(
        normalize_url(url),
        pool_size=pool_size,
        max_overflow=16,
        pool_pre_ping=True,
        hide_parameters=True,
    )


def async_sessions(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def sync_sessions(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
