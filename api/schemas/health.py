from __future__ import annotations

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: str = "ok"


class Readiness(BaseModel):
    status: str = "ok"
    checks: dict[str, str] = Field(
        description="dependency -> 'ok' or what is wrong (catalog, temporal, s3:<tier>)"
    )
