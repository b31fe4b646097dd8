from __future__ import annotations

from fastapi import APIRouter, Depends

from api.auth import require_token
from api.deps import StateDep
from api.gate import GatedRoute
from api.schemas.tiers import TierOut

router = APIRouter(prefix="/v1/tiers", tags=["tiers"], route_class=GatedRoute)


@router.get(
    "",
    response_model=list[TierOut],
    summary="Configured tiers, fastest first",
    dependencies=[Depends(require_token())],
)
async def list_tiers(state: StateDep) -> list[TierOut]:
    return [TierOut.of(t) for t in state.settings.tiers]
