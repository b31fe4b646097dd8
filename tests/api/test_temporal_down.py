"""Admin changes succeed while Temporal is unreachable: the retention request after them is best
effort (the periodic sweep catches up)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine

from api.app import create_app
from apps.devstack.services import free_port
from tests.helpers.api import running_client, seed
from tierpoint.config import Settings


async def test_changes_succeed_without_temporal(
    settings: Settings,
    catalog: Engine,
    nodes: tuple[str, str],
    job: str,
    new_policy: Callable[[], str],
) -> None:
    down = settings.model_copy(update={"temporal_address": f"127.0.0.1:{free_port()}"})
    async for client in running_client(create_app(down)):
        await seed(client, catalog, job, [1, 2])
        name = new_policy()
        r = await client.post("/v1/policies", json={"name": name, "spec": {}})
        assert r.status_code == 201, r.text
        assert (
            await client.put(f"/v1/jobs/{job}/policy", json={"policy": name})
        ).status_code == 200
        assert (
            await client.put(f"/v1/policies/{name}", json={"spec": {"durable": {}}})
        ).status_code == 200
        assert (await client.put(f"/v1/jobs/{job}/checkpoints/1/pin")).status_code == 200
        assert (await client.delete(f"/v1/jobs/{job}/checkpoints/1/pin")).status_code == 200
        lease = await client.post(f"/v1/jobs/{job}/checkpoints/2/leases", json={"ttl_seconds": 9})
        assert lease.status_code == 201, lease.text
        url = f"/v1/jobs/{job}/checkpoints/2/leases/{lease.json()['id']}"
        assert (await client.delete(url)).status_code == 204
        assert (await client.get(f"/v1/policies/{name}")).json()["version"] == 2
