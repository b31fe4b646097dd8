from __future__ import annotations

from pydantic import BaseModel

from tierpoint.config import TierConfig, TierKind


class TierOut(BaseModel):
    name: str
    kind: TierKind
    root: str | None
    bucket: str | None
    prefix: str
    endpoint_url: str | None
    region: str

    @classmethod
    def of(cls, t: TierConfig) -> TierOut:
        return cls(
            name=t.name,
            kind=t.kind,
            root=t.root,
            bucket=t.bucket,
            prefix=t.prefix,
            endpoint_url=t.endpoint_url,
            region=t.region,
        )
