"""The base of every domain error: a stable machine-readable code, the HTTP status the API
answers with, and the RFC 9457 problem document it renders as."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar


def problem_type(code: str) -> str:
    return f"urn:tierpoint:problem:{code}"


def problem_body(
    status: int,
    code: str,
    title: str,
    detail: str,
    errors: Sequence[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An RFC 9457 problem document: the API's answers and the node data endpoint's."""
    body: dict[str, Any] = {
        "type": problem_type(code),
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    if errors is not None:
        body["errors"] = list(errors)
    for k, v in (extra or {}).items():
        body.setdefault(k, v)
    return body


class TierpointError(Exception):
    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal error"

    def __init__(
        self,
        detail: str,
        *,
        errors: list[dict[str, Any]] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        # Per-field problems: [{"field", "message", "code"}].
        self.errors = errors
        # Extension members of the problem document (RFC 9457 section 3.2).
        self.extra = extra or {}

    def response_headers(self) -> dict[str, str] | None:
        """HTTP headers the API sends with this problem."""
        return None

    def problem(self) -> dict[str, Any]:
        return problem_body(
            self.status, self.code, self.title, self.detail, self.errors, self.extra
        )
