"""Access tokens and scopes: the grammar of a scope, what a token's scopes allow, and the secret.

A token is `tp_` followed by 43 URL-safe characters (256 random bits). Only its sha256 is stored:
with that much entropy a slow password hash would add latency to every request and no safety.

Scopes (docs/security.md has the table of every route):
- `train:<prefix>`: a training job's own work on jobs whose name starts with the prefix
  (register, read, lease and restore, report a bad copy, quarantine its own checkpoints);
- `read`: every read view;
- `operate`: operator actions (retry, verify, pin, quarantine, node lost, retention runs);
- `admin`: policies, policy assignment, tokens; and everything else.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from tierpoint.errors import InvalidScope, RequestInvalid, TokenExpired, TokenRevoked

TOKEN_PREFIX = "tp_"
TRAIN = "train:"
# A train prefix is the start of a job name: the job-name alphabet, never empty (an empty prefix
# would be every job, which is what `operate`/`admin` are for).
_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Token names are recorded as the actor of events: printable, no spaces, short.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$")
_SECRET_RE = re.compile(r"^tp_[A-Za-z0-9_-]{43}$")
ANONYMOUS = "anonymous"


class Scope(StrEnum):
    READ = "read"
    OPERATE = "operate"
    ADMIN = "admin"


def parse_scope(text: str) -> str:
    """A scope as stored: `read`, `operate`, `admin` or `train:<job-name prefix>`."""
    if text in Scope.__members__.values():
        return text
    if text.startswith(TRAIN) and _PREFIX_RE.match(text[len(TRAIN) :]):
        return text
    raise InvalidScope(
        f"unknown scope {text!r}: use read, operate, admin or train:<job-name prefix>"
        " (e.g. train:llama-)"
    )


def check_token_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise RequestInvalid(f"invalid token name {name!r}: [A-Za-z0-9][A-Za-z0-9._@:-]{{0,127}}")
    return name


def parse_scopes(texts: Iterable[str]) -> list[str]:
    scopes = sorted({parse_scope(t) for t in texts})
    if not scopes:
        raise InvalidScope("a token needs at least one scope")
    return scopes


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def looks_like_secret(text: str) -> bool:
    """Shape only: refuses garbage before it costs a lookup."""
    return bool(_SECRET_RE.match(text))


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: the token's name (recorded as the actor of events) and scopes."""

    name: str
    scopes: frozenset[str]

    def has(self, scope: Scope) -> bool:
        return Scope.ADMIN.value in self.scopes or scope.value in self.scopes

    def trains(self, job: str) -> bool:
        # guard: auth-train-any-job
        return any(s.startswith(TRAIN) and job.startswith(s[len(TRAIN) :]) for s in self.scopes)


ANONYMOUS_PRINCIPAL = Principal(ANONYMOUS, frozenset({Scope.ADMIN.value}))


@dataclass(frozen=True)
class TokenRecord:
    """A stored token as authentication needs it (never the secret: it is not stored)."""

    id: int
    name: str
    scopes: tuple[str, ...]
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


def principal_of(token: TokenRecord, now: datetime) -> Principal:
    """The principal of a token at `now`; raises for an expired or revoked one."""
    # guard: auth-revocation-ignored
    if token.revoked_at is not None and token.revoked_at <= now:
        raise TokenRevoked(f"token {token.name!r} was revoked")
    # guard: auth-expiry-ignored
    if token.expires_at is not None and token.expires_at <= now:
        raise TokenExpired(f"token {token.name!r} expired at {token.expires_at.isoformat()}")
    return Principal(token.name, frozenset(token.scopes))
