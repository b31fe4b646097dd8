"""The data endpoint checks the credential before anything else of a request: the attacker's
list of bad paths (every byte a path may hold, percent-encoded and raw; traversal; NUL; over-long
names and paths; no data path at all) gets 401 without a valid credential, whatever it is, and
only a caller with one learns that a path is bad (400) or not served (404). Real sockets against
a real endpoint on a real catalog; the raw bytes go out as an attacker would send them."""

from __future__ import annotations

import http.client
import json
import os
import socket
from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

from tests.helpers.lifecycle import ShardSpec, crc_hex, seed_checkpoint
from tests.helpers.tokens import create_token
from tests.tierpoint.test_data_endpoint_reads import NODE, SECRET, verified
from tierpoint.config import Settings
from tierpoint.services.data_endpoint import DataServer, serve

# Bytes that end the request line: no path holds them.
LINE_ENDS = {0x0A, 0x0D}
# The longest request line http.server reads; a longer one is refused (414) before its headers.
MAX_LINE = 65536


@pytest.fixture
def settings(catalog_settings: Settings) -> Settings:
    """The data endpoint serves files and reads the catalog: no Temporal, no S3."""
    return Settings.model_validate({**catalog_settings.model_dump(), "data_token": SECRET})


@pytest.fixture
def server(settings: Settings, sessions: sessionmaker[Session]) -> Iterator[DataServer]:
    srv = serve(settings, sessions, NODE, 0)
    yield srv
    srv.shutdown()
    srv.server_close()


def attacker_targets(job: str) -> list[bytes]:
    """Request targets as an attacker writes them, around a real served file."""
    base = f"/v1/data/ssd/{job}/1/".encode()
    targets = []
    for b in range(256):
        targets.append(base + b"a%%%02Xb.bin" % b)  # every byte, percent-encoded
        if b not in LINE_ENDS:
            targets.append(base + b"a" + bytes([b]) + b"b.bin")  # and raw
    targets += [
        base + b"../../../etc/passwd",
        base + b"..%2F..%2F..%2Fetc%2Fpasswd",
        base + b"%2e%2e/%2e%2e/x",
        base + b"a/./b",
        base + b"a//b",
        base + b"/etc/passwd",
        base + b"..",
        base + b"a\\..\\..\\b",
        f"/v1/data/ssd/{job}/../{job}/1/f.bin".encode(),
        f"/v1/data/../../{job}/1/f.bin".encode(),
        f"/v1/data/ssd/{job}/-1/f.bin".encode(),
        f"/v1/data/ssd/{job}/1e3/f.bin".encode(),
        f"/v1/data/ssd/{job}/99999999999999999999999/f.bin".encode(),
        f"/v1/data/%2E%2E/{job}/1/f.bin".encode(),
        f"/v1/data/ssd/{job}%00/1/f.bin".encode(),
        base + b"f.bin%00.txt",
        base + b"f.bin\x00.txt",
        base + b"f.bin?x=1",
        base + b"f.bin#frag",
        base + b"%",
        base + b"%zz",
        base + b"%C3%28",  # not UTF-8
        base + b"a" * 5000,  # a name longer than any tier takes
        base + (b"d/" * 2100) + b"f",  # a path deeper and longer than any tier takes
        base + b"a" * (MAX_LINE - len(base) - 64),  # as long as a request line may be
        b"/",
        b"*",
        b"/etc/passwd",
        b"/v1/data/",
        b"/v1/data/ssd",
        b"http://evil.example/v1/data/ssd/x/1/f.bin",
        b"",
        b" ",
        b"/v1/data/ssd/" + job.encode() + b"/1/f.bin extra words",
    ]
    return targets


def ask(srv: DataServer, target: bytes, credential: str | None) -> tuple[int, bytes]:
    host, port = srv.server_address[:2]
    with socket.create_connection((str(host), port), timeout=30) as sock:
        auth = b"" if credential is None else b"Authorization: Bearer %s\r\n" % credential.encode()
        sock.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n")
        resp = http.client.HTTPResponse(sock, method="GET")
        resp.begin()
        return resp.status, resp.read()


def test_every_request_without_a_valid_credential_is_401_whatever_its_path(
    settings: Settings, sessions: sessionmaker[Session], server: DataServer
) -> None:
    job = f"auth-first-{os.urandom(5).hex()}"
    data = b"the served bytes " * 100
    cp = seed_checkpoint(
        settings, sessions, job, 1, [ShardSpec(NODE, "f.bin", data, crc_hex(data))]
    )
    verified(sessions, cp.checkpoint_id, ["f.bin"])
    reader = create_token(settings.database_url, scopes=[f"train:{job}"])
    targets = attacker_targets(job)
    assert len(targets) > 500
    for target in targets:
        for credential, code in ((None, "missing_token"), ("tp_not-a-token", "invalid_token")):
            status, body = ask(server, target, credential)
            assert status == 401, (target[:120], credential, status, body[:200])
            assert json.loads(body)["code"] == code, body
            assert data[:16] not in body
        # With a credential the path is judged: refused, or not served, never another file.
        status, body = ask(server, target, reader)
        assert status in (400, 404), (target[:120], status, body[:200])
        assert data[:16] not in body
    # The served file itself, to each credential.
    target = f"/v1/data/ssd/{job}/1/f.bin".encode()
    assert ask(server, target, None)[0] == 401
    assert ask(server, target, reader) == (200, data)
    assert ask(server, target, SECRET) == (200, data)
    # A request line longer than http.server reads is refused before its headers: 414.
    assert ask(server, b"/" + b"a" * MAX_LINE, None)[0] == 414
