"""Request field types that accept exactly what their JSON schema promises."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BeforeValidator, Field, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

# Postgres text and jsonb refuse NUL: every request string that can reach the catalog says so in
# its schema with this pattern (or a pattern of its own that excludes NUL too).
NO_NUL = "^[^\\x00]*$"


def _json_int(value: Any) -> Any:
    # JSON Schema's "integer" is any number with a zero fraction (1000.0 included) and nothing
    # else: lax pydantic takes that, but also "1000" and true, which the schema calls invalid.
    if isinstance(value, bool | str | bytes):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


JsonInt = Annotated[int, BeforeValidator(_json_int), Field(strict=False)]


def text_value(value: str) -> str:
    """A string Postgres can store: no NUL, no lone surrogate (which has no UTF-8 encoding)."""
    if "\x00" in value:
        raise PydanticCustomError("invalid_text", "must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise PydanticCustomError("invalid_text", "must be valid Unicode text") from None
    return value


class _NoNulPattern:
    # A schema hook rather than Field(json_schema_extra=...): a field's own Field() would drop that.
    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core_schema)
        schema.setdefault("pattern", NO_NUL)
        return schema


# The one request string type: 422 `invalid_text` for what the catalog cannot store, and the
# schema's pattern says so. Strings with a pattern of their own (names) exclude NUL through it.
Text = Annotated[str, AfterValidator(text_value), _NoNulPattern]

# A time in a request: RFC 3339 with its offset (a naive one is refused: whose clock?), parsed from
# the JSON string; its schema excludes NUL as every request string's does.
Timestamp = Annotated[AwareDatetime, Field(strict=False), _NoNulPattern]
