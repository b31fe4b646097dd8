from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class FieldError(BaseModel):
    field: str = Field(description="Where in the request, e.g. shards[3].path.")
    location: str = Field(description="body, path, query or header.")
    message: str
    code: str


class Problem(BaseModel):
    """RFC 9457 problem details; `code` is stable and meant for programs."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(examples=["urn:tierpoint:problem:unsafe_path"])
    title: str
    status: int
    detail: str
    code: str = Field(examples=["unsafe_path"])
    errors: list[FieldError] | None = None
