"""The API's bearer tokens."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Integer,
    String,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from tierpoint.catalog.models._base import Base


class AccessToken(Base):
    """A bearer token of the API. Only the sha256 of the secret is stored: the secret has 256 bits
    of entropy, so a slow password hash would add latency to every request and no safety."""

    __tablename__ = "access_token"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    # e.g. ["train:llama-"], ["read"], ["operate", "read"], ["admin"]
    scopes: Mapped[list[str]] = mapped_column(JSONB)
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]
