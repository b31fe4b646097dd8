"""Request field types that accept exactly what their JSON schema promises."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError


def _json_int(value: Any) -> Any:
    # JSON Schema's "integer" is any number with a zero fraction (1000.0 included) and nothing
    # else: lax pydantic takes that, but also "1000" and true, which the schema calls invalid.
    if isinstance(value, bool | str | bytes):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


JsonInt = Annotated[int, BeforeValidator(_json_int), Field(strict=False)]
