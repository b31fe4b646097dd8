"""Who is asking: bearer tokens, their scopes and their management."""

from __future__ import annotations

from typing import ClassVar

from tierpoint.errors.base import TierpointError


class Unauthenticated(TierpointError):
    """401: no bearer token. RFC 6750 asks for a `WWW-Authenticate: Bearer` challenge."""

    code = "missing_token"
    status = 401
    title = "Authentication required"
    bearer_error: ClassVar[str | None] = None

    def response_headers(self) -> dict[str, str] | None:
        challenge = 'Bearer realm="tierpoint"'
        if self.bearer_error is not None:
            challenge += f', error="{self.bearer_error}"'
        return {"WWW-Authenticate": challenge}


class InvalidToken(Unauthenticated):
    code = "invalid_token"
    title = "Invalid token"
    bearer_error = "invalid_token"


class TokenExpired(InvalidToken):
    code = "token_expired"
    title = "Token expired"


class TokenRevoked(InvalidToken):
    code = "token_revoked"
    title = "Token revoked"


class InsufficientScope(TierpointError):
    code = "insufficient_scope"
    status = 403
    title = "Token scope too small"

    def __init__(self, detail: str, *, required: str) -> None:
        super().__init__(detail, extra={"required_scope": required})
        self.required = required

    def response_headers(self) -> dict[str, str] | None:
        return {
            "WWW-Authenticate": 'Bearer realm="tierpoint", error="insufficient_scope", '
            f'scope="{self.required}"'
        }


class InvalidScope(TierpointError):
    code = "invalid_scope"
    status = 422
    title = "Invalid token scope"


class TokenNotFound(TierpointError):
    code = "token_not_found"
    status = 404
    title = "Token not found"


class TokenExists(TierpointError):
    code = "token_exists"
    status = 409
    title = "A token with this name exists"
