from __future__ import annotations

import asyncio
from typing import Any

from botocore.config import Config
from fastapi import APIRouter, Depends

from api.auth import public
from api.deps import ApiState, StateDep
from api.gate import GatedRoute
from api.problems import problem_responses
from api.schemas.health import Health, Readiness
from tierpoint.catalog.engine import ping
from tierpoint.errors import NotReady
from tierpoint.storage.s3.credentials import tier_session
from tierpoint.tier_config import TierConfig, TierKind

router = APIRouter(tags=["health"], route_class=GatedRoute)

CHECK_TIMEOUT = 3.0


@router.get(
    "/healthz",
    response_model=Health,
    summary="The process is alive",
    dependencies=[Depends(public)],
)
async def healthz() -> Health:
    return Health()


async def _catalog(state: ApiState) -> str | None:
    await ping(state.engine)
    return None


def _s3_client(state: ApiState, tier: TierConfig) -> Any:
    client = state.s3_clients.get(tier.name)
    if client is None:
        # The tier's own credentials, as its copies use them: a probe signed with other keys
        # would fail on an endpoint that the workers reach.
        client = tier_session(tier).client(
            "s3",
            endpoint_url=tier.endpoint_url,
            region_name=tier.region,
            config=Config(connect_timeout=2, read_timeout=2, retries={"max_attempts": 1}),
        )
        state.s3_clients[tier.name] = client
    return client


async def _s3(state: ApiState, tier: TierConfig) -> str | None:
    client = _s3_client(state, tier)
    try:
        await asyncio.to_thread(client.head_bucket, Bucket=tier.bucket)
    except Exception as exc:
        return f"bucket {tier.bucket!r}: {type(exc).__name__}: {exc}"
    return None


async def _guard(name: str, check: Any) -> tuple[str, str]:
    try:
        problem = await asyncio.wait_for(check, timeout=CHECK_TIMEOUT)
    except TimeoutError:
        problem = f"no answer within {CHECK_TIMEOUT:g}s"
    except Exception as exc:
        problem = f"{type(exc).__name__}: {exc}"
    return name, problem or "ok"


@router.get(
    "/readyz",
    response_model=Readiness,
    responses=problem_responses(503),
    summary="The catalog, Temporal and every S3 tier answer",
    dependencies=[Depends(public)],
)
async def readyz(state: StateDep) -> Readiness:
    checks = [
        _guard("catalog", _catalog(state)),
        _guard("temporal", state.temporal.check()),
        *(
            _guard(f"tier:{t.name}", _s3(state, t))
            for t in state.settings.tiers
            if t.kind is TierKind.S3
        ),
    ]
    results = dict(await asyncio.gather(*checks))
    down = {k: v for k, v in results.items() if v != "ok"}
    if down:
        raise NotReady(
            "not ready: " + "; ".join(f"{k}: {v}" for k, v in down.items()),
            extra={"checks": results},
        )
    return Readiness(checks=results)
