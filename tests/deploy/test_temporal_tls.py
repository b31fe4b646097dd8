"""The API and the workers against a Temporal frontend that requires mutual TLS (as Temporal
Cloud does with mTLS): a CA made by the test, the `temporal_tls_*` settings, real processes."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.service import RPCError

from apps.devstack.services import free_port
from tests.helpers.api_process import api_process
from tests.helpers.pki import SERVER_NAME, Pki, make_pki
from tests.helpers.services import Services
from tests.helpers.tls_proxy import TlsProxy, tls_proxy
from tests.helpers.worker_process import worker_process
from tierpoint.config import Settings
from tierpoint.contract.retention import SWEEP_SCHEDULE_ID
from tierpoint.temporal import connect

# Guards against a hang, not a performance assertion.
WAIT = 180.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def proxy(pki: Pki, services: Services) -> Iterator[TlsProxy]:
    with tls_proxy(pki, services.temporal_address) as running:
        yield running


def _over_tls(settings: Settings, proxy: TlsProxy, pki: Pki, **extra: object) -> Settings:
    return settings.model_copy(
        update={
            "temporal_address": proxy.address,
            "temporal_tls_ca": pki.ca,
            "temporal_tls_cert": pki.client_cert,
            "temporal_tls_key": pki.client_key,
            "temporal_tls_server_name": SERVER_NAME,
            **extra,
        }
    )


async def test_a_client_without_tls_or_without_a_certificate_is_refused(
    settings: Settings, proxy: TlsProxy, pki: Pki
) -> None:
    for refused in (
        settings.model_copy(update={"temporal_address": proxy.address}),
        settings.model_copy(
            update={
                "temporal_address": proxy.address,
                "temporal_tls_ca": pki.ca,
                "temporal_tls_server_name": SERVER_NAME,
            }
        ),
    ):
        # connect() asks the server for its capabilities: the handshake fails first.
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(connect(refused), WAIT)
    assert proxy.clients == []


def _get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_api_and_workers_serve_through_mutual_tls(
    settings: Settings, proxy: TlsProxy, pki: Pki, tmp_path: Path
) -> None:
    tls = _over_tls(settings, proxy, pki)
    client = await connect(tls)
    with worker_process(tls, None, tmp_path / "worker.log") as shared:
        # The shared worker creates the retention sweep's schedule once it is connected.
        async def sweep_schedule() -> None:
            while True:
                assert shared.alive(), shared.output()
                try:
                    await client.get_schedule_handle(SWEEP_SCHEDULE_ID).describe()
                    return
                except RPCError:
                    await asyncio.sleep(0.5)

        await asyncio.wait_for(sweep_schedule(), WAIT)
        with api_process(tls, free_port(), tmp_path / "api.log") as api:
            await asyncio.to_thread(api.wait_ready)
            status, body = await asyncio.to_thread(_get, api.url + "/readyz")
            assert status == 200, (body, api.output())
    # Every connection came through the proxy, with the client's certificate.
    assert len(proxy.clients) >= 3 and set(proxy.clients) == {pki.client_name}
