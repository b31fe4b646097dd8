"""Mutual TLS on the data endpoint, on real services and a real `tierpoint worker` process: with
`data_tls_client_auth` a node's endpoint admits only clients presenting a certificate of
`data_tls_ca`. The holder's pull presents its `data_tls_client_cert` and the peer copy is made;
a client restores from the peer copy with the TIERPOINT_DATA_TLS_* variables. Without a
certificate, with one of another CA, or with an expired one, the connection is refused at the
handshake: the endpoint counts and logs the refusal and serves no byte. A certificate does not
replace the bearer credential. A node worker configured for mTLS without its own client
certificate refuses to start and says what to set."""

from __future__ import annotations

import ssl
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client
from tierpoint_client import Client as TierpointClient
from tierpoint_client.errors import TierpointError

from api.app import create_app
from apps.devstack.services import free_port
from apps.worker import check_data_tls
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
from tests.helpers.pki import Pki, issue_client, make_pki
from tests.helpers.scrape import json_lines, parse, scrape, value, wait_serving, worker_with_metrics
from tests.helpers.tokens import create_token
from tests.helpers.worker_process import REPO, settings_env
from tierpoint.config import Settings
from tierpoint.storage.base import ShardRef
from tierpoint.storage.peer_http import PeerSource, tls_context

SERVED = "tierpoint_worker_data_bytes_served_total"
REFUSED = "tierpoint_worker_data_handshakes_refused_total"
REFUSAL_LOG = "data endpoint refused a TLS handshake"


def mtls_settings(settings: Settings, tmp_path: Path, nodes: list[str], pki: Pki) -> Settings:
    return tls_peer_settings(settings, tmp_path, nodes, pki, client_auth=True)


async def test_only_clients_with_a_certificate_of_the_ca_are_served(
    settings: Settings,
    sessions: sessionmaker[Session],
    client: Client,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pki = make_pki(tmp_path / "pki")
    stranger = make_pki(tmp_path / "other-ca", client_name="stranger")
    expired = issue_client(pki, "expired", "tierpoint-expired", expired=True)
    tag = uuid.uuid4().hex[:8]
    source, holder = f"m-{tag}-a", f"m-{tag}-b"
    base = mtls_settings(settings, tmp_path, [source, holder], pki)
    job = f"mtls-{tag}"
    data = bytes(range(256)) * 4099
    seeded = seed_checkpoint(
        base, sessions, job, 2, [ShardSpec(source, "w.bin", data, crc_hex(data))]
    )
    ref = ShardRef(job, 2, "w.bin")
    port, log = free_port(), tmp_path / "source.log"
    args = ["--node", source, "--no-shared"]
    with worker_with_metrics(base, args, port, log) as proc:
        await wait_serving(proc, port, log)
        async with running_workers(base, client, nodes=[holder]):
            urls = await wait_for_endpoints(sessions, [source, holder], 60)
            # The holder's pull from the source's process presents its client certificate.
            result, _ = await run_lifecycle(client, seeded)
            state = {t.tier: t.state for t in result.tiers}
            assert state == {"ssd": "restorable", "peer": "restorable"}, markers(
                sessions, seeded.checkpoint_id
            )
            copy = peer_copies(sessions, seeded.checkpoint_id)["w.bin"]
            assert (copy.node, copy.state) == (holder, "verified")
            before = parse(await scrape(port))
            served = value(before, SERVED, tier="ssd")
            # The holder's pull, once (or again, had a retry pulled it twice).
            assert served is not None and served >= len(data), before

            def pull(tls: ssl.SSLContext, token: str = WORKER_SECRET) -> bytes:
                with PeerSource(urls[source], "ssd", token, tls).open_read(ref) as body:
                    return body.read()

            # Refused at the handshake: no certificate, another CA's, an expired one of the CA.
            for cert, key in (
                (None, None),
                (stranger.client_cert, stranger.client_key),
                expired,
            ):
                with pytest.raises(ConnectionError):
                    pull(tls_context(pki.ca, cert, key))
            # A certificate is no credential: the token still applies on top.
            with pytest.raises(PermissionError, match="refused the credential"):
                pull(tls_context(pki.ca, pki.client_cert, pki.client_key), "tp_not-a-token")
            after = parse(await scrape(port))
            assert value(after, SERVED, tier="ssd") == served, "a refused client was served"
            reasons = {
                dict(labels)["reason"]: n
                for (name, labels), n in after.items()
                if name == REFUSED and n
            }
            assert sum(reasons.values()) == 3, reasons
            assert "certificate has expired" in reasons, reasons
            refusals = [line for line in json_lines(log) if line.get("event") == REFUSAL_LOG]
            assert len(refusals) == 3, refusals

            # With its certificate a pull is served (a ranged read from a resume offset too).
            good = tls_context(pki.ca, pki.client_cert, pki.client_key)
            assert pull(good) == data
            with PeerSource(urls[source], "ssd", WORKER_SECRET, good).open_read(ref, 7) as body:
                assert body.read() == data[7:]

            # A restore on the holder reads its peer copy: refused without the client
            # certificate (the only copy it can reach), served with it.
            trainer = create_token(base.database_url, scopes=[f"train:{job}"])
            monkeypatch.setenv("TIERPOINT_DATA_TLS_CA", str(pki.ca))
            async with serving(create_app(base)) as api:
                tp = TierpointClient(api, token=trainer)
                with pytest.raises(TierpointError):
                    tp.restore(job, tmp_path / "refused", node=holder)
                monkeypatch.setenv("TIERPOINT_DATA_TLS_CLIENT_CERT", str(pki.client_cert))
                monkeypatch.setenv("TIERPOINT_DATA_TLS_CLIENT_KEY", str(pki.client_key))
                restored = tp.restore(job, tmp_path / "restore", node=holder)
    assert {f.path: f.tier for f in restored.files} == {"w.bin": "peer"}
    assert (tmp_path / "restore" / "w.bin").read_bytes() == data


def test_a_node_worker_for_mtls_without_its_client_certificate_refuses_to_start(
    settings: Settings, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    full = mtls_settings(settings, tmp_path, ["lone"], pki)
    missing = full.model_copy(update={"data_tls_client_cert": None, "data_tls_client_key": None})
    r = subprocess.run(
        [sys.executable, "-m", "apps.cli.main", "worker", "--node", "lone", "--no-shared"],
        cwd=REPO,
        env=settings_env(missing),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "TIERPOINT_DATA_TLS_CLIENT_CERT" in out and "Traceback" not in out, out

    # A key that is not the certificate's is said at start too, not at the first pull.
    wrong = full.model_copy(update={"data_tls_client_key": pki.server_key})
    r = subprocess.run(
        [sys.executable, "-m", "apps.cli.main", "worker", "--node", "lone", "--no-shared"],
        cwd=REPO,
        env=settings_env(wrong),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "cannot load data_tls_client_cert" in out, out

    # Client authentication needs the endpoint's TLS and the CA that signs the clients.
    for unset in ({"data_tls_ca": None}, {"data_tls_cert": None, "data_tls_key": None}):
        with pytest.raises(ValueError, match="TIERPOINT_DATA_TLS_CA"):
            check_data_tls(full.model_copy(update=unset))
    check_data_tls(full)
    with pytest.raises(ValidationError, match="go together"):
        Settings.model_validate({**full.model_dump(), "data_tls_client_key": None})
