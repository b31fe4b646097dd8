"""`tierpoint api` over HTTPS, as docs/deployment.md sets it up ("TLS for the API"): the client
trusts the CA it is given and gets answers; a plain-HTTP client gets none; a client that does not
trust the certificate, or reaches the API under a name the certificate does not carry, refuses
it; with a client CA (mutual TLS), a client without a certificate of that CA is refused."""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tierpoint_client import ApiTls, Client, RetryPolicy, TransportError

from apps.devstack.services import free_port
from tests.helpers.pki import Pki, issue_client, make_pki
from tests.helpers.tokens import create_token
from tests.helpers.worker_process import REPO, settings_env
from tierpoint.config import Settings

START_TIMEOUT = 120.0  # a hang guard


@contextlib.contextmanager
def https_api(settings: Settings, log: Path, *tls_args: str) -> Iterator[int]:
    """`tierpoint api` with `tls_args`, until it answers on its port; the port."""
    port = free_port()
    args = ["api", "--host", "127.0.0.1", "--port", str(port), *tls_args]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "apps.cli.main", *args],
            cwd=REPO,
            env=settings_env(settings),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(60)


def _client(port: int, token: str, tls: ApiTls, host: str = "127.0.0.1") -> Client:
    return Client(f"https://{host}:{port}", token=token, tls=tls, retry=RetryPolicy(attempts=1))


def _plain_http_answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10):
            return True
    except urllib.error.HTTPError:
        return True  # an HTTP answer, even an error, is an answer in the clear
    except (OSError, http.client.HTTPException):
        return False


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


def test_https_with_a_certificate(settings: Settings, pki: Pki, tmp_path: Path) -> None:
    token = create_token(settings.database_url)
    other = make_pki(tmp_path / "other")
    tls = ("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key))
    with https_api(settings, tmp_path / "api.log", *tls) as port:
        tiers = _client(port, token, ApiTls(ca=str(pki.ca))).tiers()
        assert [t.name for t in tiers] == [t.name for t in settings.tiers]
        # The bearer token never crosses in the clear: plain HTTP gets no answer at all.
        assert not _plain_http_answers(port)
        # A client trusting another CA refuses the certificate, as does one reaching the API by a
        # name the certificate does not carry.
        with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
            _client(port, token, ApiTls(ca=str(other.ca))).tiers()
        with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
            _client(port, token, ApiTls(ca=str(pki.ca)), host="localhost").tiers()


def test_mutual_tls_admits_only_clients_of_its_ca(
    settings: Settings, pki: Pki, tmp_path: Path
) -> None:
    token = create_token(settings.database_url)
    other = make_pki(tmp_path / "other")
    tls = (
        *("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)),
        *("--tls-client-ca", str(pki.ca)),
    )
    with https_api(settings, tmp_path / "api.log", *tls) as port:
        ca = str(pki.ca)
        mine = _client(port, token, ApiTls(ca, str(pki.client_cert), str(pki.client_key)))
        assert mine.tiers()
        stranger_cert, stranger_key = issue_client(other, "stranger", "stranger")
        for tls_of in (ApiTls(ca), ApiTls(ca, str(stranger_cert), str(stranger_key))):
            with pytest.raises(TransportError):
                _client(port, token, tls_of).tiers()


def test_tls_settings_go_together(settings: Settings, pki: Pki, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "apps.cli.main", "api", "--tls-cert", str(pki.server_cert)],
        cwd=REPO,
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    said = " ".join((out.stdout + out.stderr).split())  # the console wraps long lines
    assert "api_tls_cert and api_tls_key go together" in said


def test_the_context_trusts_only_the_given_ca(pki: Pki) -> None:
    context = ApiTls(ca=str(pki.ca)).context()
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
