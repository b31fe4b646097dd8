from __future__ import annotations

from pydantic import BaseModel, Field

from tierpoint.cost import held_per_byte
from tierpoint.tier_config import TierConfig, TierKind


class TierCodeOut(BaseModel):
    code: str = Field(description="its one spelling, e.g. `rs(8,2)`")
    k: int = Field(description="data stripes per set: any k of the k+m give a file back")
    m: int = Field(description="parity stripes per set: the holders of a set it survives losing")
    overhead: float = Field(
        description="bytes held on the holders per byte of the files, (k+m)/k: 1.25 for rs(8,2)"
    )


class TierOut(BaseModel):
    name: str
    kind: TierKind
    root: str | None
    bucket: str | None
    prefix: str
    endpoint_url: str | None
    region: str
    credentials_profile: str | None = Field(
        default=None,
        description="S3 tiers: the AWS profile whose keys read this tier (a client restoring "
        "from it uses the same), null for the standard AWS chain",
    )
    credentials_env: str | None = Field(
        default=None,
        description="S3 tiers: the environment prefix whose `<PREFIX>_ACCESS_KEY_ID` and "
        "`<PREFIX>_SECRET_ACCESS_KEY` read this tier (a client restoring from it uses the same), "
        "null for the standard AWS chain",
    )
    copies: int = Field(
        ge=1,
        description="the copies of each node's files its configured tier keeps: K for each of "
        "the K tiers a peer tier configured with `copies = K` stands for, else 1",
    )
    copy_of: str | None = Field(
        description="with `copies` > 1: the configured peer tier this tier is a copy of (its "
        "own name for the first copy); null otherwise"
    )
    copy_number: int | None = Field(
        ge=1,
        description="with `copies` > 1: which of the K copies this tier holds, 1..K; null "
        "otherwise",
    )
    code: TierCodeOut | None = Field(
        default=None,
        description='a peer tier configured with `code = "rs(k,m)"`: the erasure code its '
        "stripes are cut with; null for a tier of whole copies",
    )

    @classmethod
    def of(cls, t: TierConfig) -> TierOut:
        expanded = t.copies > 1
        return cls(
            name=t.name,
            kind=t.kind,
            root=t.root,
            bucket=t.bucket,
            prefix=t.prefix,
            endpoint_url=t.endpoint_url,
            region=t.region,
            credentials_profile=t.credentials_profile,
            credentials_env=t.credentials_env,
            copies=t.copies,
            copy_of=t.configured_name if expanded else None,
            copy_number=t.copy_number if expanded else None,
            code=_code(t),
        )


def _code(t: TierConfig) -> TierCodeOut | None:
    code = t.stripe_code
    if code is None:
        return None
    return TierCodeOut(code=str(code), k=code.k, m=code.m, overhead=held_per_byte(t))
