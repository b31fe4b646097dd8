"""Access tokens on a real catalog: only a secret's digest is stored, a name means one token for
good (a revoked one's included), a revocation is idempotent, an install's first admin token is
made once, and a lookup by digest finds a token whatever its state."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from tierpoint.auth import digest
from tierpoint.catalog.models import AccessToken
from tierpoint.catalog.token.tokens import (
    NewToken,
    create_token,
    first_admin_token,
    revoke_token,
    token_by_digest,
    touch,
)
from tierpoint.errors import TokenExists, TokenNotFound


def _name() -> str:
    return f"tok-{uuid.uuid4().hex[:8]}"


def test_only_the_digest_of_a_secret_is_stored(session: Session) -> None:
    name = _name()
    made = create_token(session, name, ["read", "operate"], timedelta(days=1))
    row = session.scalars(select(AccessToken).where(AccessToken.name == name)).one()
    assert row.digest == digest(made.secret) and made.secret not in repr(row.__dict__)
    assert made.view.scopes == ["operate", "read"] and row.expires_at is not None
    found = token_by_digest(session, digest(made.secret))
    assert found is not None and found.name == name and found.last_used_at is None
    touch(session, found.id)
    touched = token_by_digest(session, digest(made.secret))
    assert touched is not None and touched.last_used_at is not None
    assert token_by_digest(session, digest(made.secret + "x")) is None


def test_a_name_is_one_token_for_good_and_revoking_it_again_changes_nothing(
    session: Session,
) -> None:
    name = _name()
    made = create_token(session, name, ["read"], None)
    session.commit()  # as the CLI does: the refusal below rolls back only what followed
    view, revoked = revoke_token(session, name)
    assert revoked and view.revoked_at is not None
    again, revoked_again = revoke_token(session, name)
    assert not revoked_again and again.revoked_at == view.revoked_at
    session.commit()
    with pytest.raises(TokenExists):
        create_token(session, name, ["read"], None)
    kept = token_by_digest(session, digest(made.secret))
    assert kept is not None and kept.revoked_at == view.revoked_at
    with pytest.raises(TokenNotFound):
        revoke_token(session, _name())
    # The dev stack makes its admin token anew at every start.
    remade = create_token(session, name, ["admin"], None, replace=True)
    assert token_by_digest(session, digest(made.secret)) is None
    renewed = token_by_digest(session, digest(remade.secret))
    assert renewed is not None and renewed.revoked_at is None


def test_the_first_admin_token_is_made_once_and_again_after_revocation(session: Session) -> None:
    first = first_admin_token(session, _name(), None)
    assert isinstance(first, NewToken)
    second = first_admin_token(session, _name(), None)
    assert not isinstance(second, NewToken) and second.name == first.view.name
    revoke_token(session, first.view.name)
    third = first_admin_token(session, _name(), None)
    assert isinstance(third, NewToken) and third.view.name != first.view.name
