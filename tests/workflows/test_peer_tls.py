"""The data endpoint over TLS, on real services: with `data_tls_cert`/`data_tls_key` a node's
endpoint speaks HTTPS only and reports an `https://` URL; the holder pulls its peer copy through
it, verifying the endpoint's certificate against `data_tls_ca`; a client restores from the peer
copy trusting the CA through `SSL_CERT_FILE`. A reader that does not trust the CA, or speaks
plain HTTP, gets nothing. The certificates are made here (a CA, and a server certificate for
127.0.0.1)."""

from __future__ import annotations

import ssl
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient

from api.app import create_app
from tests.helpers.cli import serving
from tests.helpers.lifecycle import (
    ShardSpec,
    crc_hex,
    markers,
    run_lifecycle,
    running_workers,
    seed_checkpoint,
)
from tests.helpers.peer_faults import (
    WORKER_SECRET,
    peer_copies,
    tls_peer_settings,
    wait_for_endpoints,
)
from tests.helpers.pki import make_pki
from tests.helpers.tokens import bearer, create_token
from tierpoint.config import Settings
from tierpoint.storage.base import ShardRef
from tierpoint.storage.peer_http import PeerSource, shard_url, tls_context


async def test_a_peer_copy_and_a_restore_over_tls(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pki = make_pki(tmp_path / "pki")
    source, holder = "tls-p", "tls-q"
    base = tls_peer_settings(settings, tmp_path, [source, holder], pki)
    job = f"tls-{uuid.uuid4().hex[:10]}"
    data = bytes(range(256)) * 4099
    seeded = seed_checkpoint(
        base, sessions, job, 2, [ShardSpec(source, "w.bin", data, crc_hex(data))]
    )
    trainer = create_token(base.database_url, scopes=[f"train:{job}"])
    ref = ShardRef(job, 2, "w.bin")
    async with running_workers(base, client, nodes=[source, holder]):
        urls = await wait_for_endpoints(sessions, [source, holder], 60)
        assert all(u.startswith("https://127.0.0.1:") for u in urls.values()), urls
        result, _ = await run_lifecycle(client, seeded)
        state = {t.tier: t.state for t in result.tiers}
        assert state == {"ssd": "restorable", "peer": "restorable"}, markers(
            sessions, seeded.checkpoint_id
        )
        copy = peer_copies(sessions, seeded.checkpoint_id)["w.bin"]
        assert (copy.node, copy.state) == (holder, "verified")

        url = shard_url(urls[source], "ssd", ref)
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=pki.ca)) as http:
            r = await http.get(url, headers=bearer(WORKER_SECRET))
            assert r.status_code == 200 and r.content == data
        # The system roots do not vouch for this endpoint; plain HTTP gets no answer.
        async with httpx.AsyncClient() as http:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await http.get(url, headers=bearer(WORKER_SECRET))
            with pytest.raises(httpx.HTTPError):
                await http.get(url.replace("https:", "http:"), headers=bearer(WORKER_SECRET))
        # A worker's pull verifies the certificate too: only with the CA it is given.
        with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            PeerSource(urls[source], "ssd", WORKER_SECRET, tls_context()).open_read(ref)
        with PeerSource(urls[source], "ssd", WORKER_SECRET, tls_context(pki.ca)).open_read(
            ref, 1000
        ) as body:
            assert body.read() == data[1000:]

        # A restore on a node without the shard reads the holder's peer copy over HTTPS.
        monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))
        async with serving(create_app(base)) as api:
            restored = TierpointClient(api, token=trainer).restore(
                job, tmp_path / "restore", node=holder
            )
    assert {f.path: f.tier for f in restored.files} == {"w.bin": "peer"}
    assert (tmp_path / "restore" / "w.bin").read_bytes() == data
