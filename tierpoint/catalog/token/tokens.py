"""Access tokens in the catalog: create, list, revoke (the `tierpoint token` commands and the dev
stack), and the lookup by digest with a cheap `last_used_at` touch (the API's authentication,
through `AsyncSession.run_sync`, and a worker's node data endpoint).

Only the digest of a secret is ever written; the secret exists in the caller's memory once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tierpoint.auth import TokenRecord, check_token_name, digest, new_secret, parse_scopes
from tierpoint.catalog.models import AccessToken
from tierpoint.errors import TokenExists, TokenNotFound

# last_used_at is for audits ("is this token still used?"), not a request log: one write a
# minute per token at most.
TOUCH_EVERY = timedelta(minutes=1)


@dataclass(frozen=True)
class TokenView:
    name: str
    scopes: list[str]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None

    def status(self, now: datetime) -> str:
        if self.revoked_at is not None and self.revoked_at <= now:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"


@dataclass(frozen=True)
class NewToken:
    """A created token: `secret` is shown once and never stored."""

    secret: str
    view: TokenView


def _view(row: AccessToken) -> TokenView:
    return TokenView(
        row.name, list(row.scopes), row.created_at, row.expires_at, row.revoked_at, row.last_used_at
    )


def create_token(
    session: Session,
    name: str,
    scopes: list[str],
    expires_in: timedelta | None,
    *,
    replace: bool = False,
) -> NewToken:
    """A new token named `name` (TokenExists if the name is taken, revoked tokens included: a
    name in past events must keep meaning one token). `replace` deletes a token of that name
    first, for the dev stack that makes its admin token anew at every start."""
    check_token_name(name)
    scopes = parse_scopes(scopes)
    secret = new_secret()
    if replace:
        session.execute(delete(AccessToken).where(AccessToken.name == name))
    expires_at = None
    if expires_in is not None:
        now: datetime = session.execute(select(func.now())).scalar_one()
        expires_at = now + expires_in
    row = AccessToken(name=name, digest=digest(secret), scopes=scopes, expires_at=expires_at)
    session.add(row)
    try:
        session.flush()
    except IntegrityError:
        session.rollback()
        raise TokenExists(f"a token named {name!r} exists; pick another name") from None
    session.refresh(row)
    return NewToken(secret, _view(row))


# pg_advisory_xact_lock key of `first_admin_token`: two bootstraps at once make one token.
_BOOTSTRAP_LOCK = 0x7469657270_01


def first_admin_token(
    session: Session, name: str, expires_in: timedelta | None
) -> NewToken | TokenView:
    """An install's first admin token: a new one named `name`, or the view of an active admin
    token that exists already (then nothing is made), so a bootstrap can run again safely."""
    session.execute(select(func.pg_advisory_xact_lock(_BOOTSTRAP_LOCK)))
    existing = session.scalars(
        select(AccessToken)
        .where(
            AccessToken.scopes.contains(["admin"]),
            AccessToken.revoked_at.is_(None),
            or_(AccessToken.expires_at.is_(None), AccessToken.expires_at > func.now()),
        )
        .order_by(AccessToken.created_at)
        .limit(1)
    ).one_or_none()
    # guard: token-bootstrap-once
    if existing is not None:
        return _view(existing)
    return create_token(session, name, ["admin"], expires_in)


def list_tokens(session: Session) -> list[TokenView]:
    rows = session.scalars(select(AccessToken).order_by(AccessToken.name))
    return [_view(r) for r in rows]


def revoke_token(session: Session, name: str) -> tuple[TokenView, bool]:
    """Revoke a token by name; (its view, whether this call revoked it). Idempotent."""
    row = session.scalars(
        select(AccessToken).where(AccessToken.name == name).with_for_update()
    ).one_or_none()
    if row is None:
        raise TokenNotFound(f"no token named {name!r}")
    if row.revoked_at is not None:
        return _view(row), False
    row.revoked_at = session.execute(select(func.now())).scalar_one()
    session.flush()
    return _view(row), True


def _by_digest(token_digest: str) -> Any:
    return select(
        AccessToken.id,
        AccessToken.name,
        AccessToken.scopes,
        AccessToken.expires_at,
        AccessToken.revoked_at,
        AccessToken.last_used_at,
    ).where(AccessToken.digest == token_digest)


def _record(row: Any) -> TokenRecord | None:
    if row is None:
        return None
    return TokenRecord(
        row.id, row.name, tuple(row.scopes), row.expires_at, row.revoked_at, row.last_used_at
    )


def token_by_digest(session: Session, token_digest: str) -> TokenRecord | None:
    """The token with this digest, whatever its state (the caller tells expired from revoked):
    the API's authentication and a worker's node data endpoint both ask here."""
    return _record(session.execute(_by_digest(token_digest)).one_or_none())


def touch(session: Session, token_id: int) -> None:
    """Set last_used_at unless it was set within TOUCH_EVERY: a no-op write costs nothing."""
    session.execute(
        update(AccessToken)
        .where(
            AccessToken.id == token_id,
            or_(
                AccessToken.last_used_at.is_(None),
                AccessToken.last_used_at < func.now() - TOUCH_EVERY,
            ),
        )
        .values(last_used_at=func.now())
    )
