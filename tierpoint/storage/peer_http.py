"""The node data endpoint's addresses, and the reader a peer copy pulls its source through.

A node worker serves its local and peer tier files at
`<data_url>/v1/data/<tier>/<job>/<step>/<path>`. A shard path is a POSIX name, not a URL: it is
percent-encoded whole into the URL here and decoded once by the endpoint, so `?`, `#` and `%`
stay the characters they are (`shard_url` and `parse_data_path` are inverses).

A stripe its shard's node staged for a coded tier's holder to pull is at the same address with
`<tier>~<index>` for the tier (`stripe_url`): `~` is in no tier name, so the two never meet.
"""

from __future__ import annotations

import http.client
import io
import ssl
from pathlib import Path
from typing import BinaryIO, cast
from urllib.parse import quote, unquote, urlsplit

from tierpoint.config import Settings
from tierpoint.storage.base import ShardRef
from tierpoint.storage.paths import (
    parse_step_dir,
    step_dir,
    validate_name,
    validate_relative_path,
)

PREFIX = "/v1/data/"
# A peer read that hears nothing for this long fails, and its copy is retried from its heartbeat.
READ_TIMEOUT = 60.0


def shard_url(base: str, tier: str, ref: ShardRef) -> str:
    return f"{base.rstrip('/')}{data_path(tier, ref)}"


def data_path(tier: str, ref: ShardRef) -> str:
    where = step_dir(ref.step, ref.branch)
    return f"{PREFIX}{quote(tier, safe='')}/{quote(ref.job, safe='')}/{where}/" + quote(
        ref.path, safe="/"
    )


STRIPE_MARK = "~"


def stripe_url(base: str, tier: str, index: int, ref: ShardRef) -> str:
    """Where the shard's node serves stripe `index` of it, staged for the holder to pull."""
    return shard_url(base, f"{tier}{STRIPE_MARK}{index}", ref)


def staged_stripe(tier: str) -> tuple[str, int | None]:
    """(tier, stripe index) of a data path's tier part; the index None for a plain tier.
    ValueError for an index that is not a plain number."""
    name, mark, index = tier.partition(STRIPE_MARK)
    if not mark:
        return name, None
    if not (index.isascii() and index.isdigit()) or str(int(index)) != index:
        raise ValueError("a staged stripe is <tier>~<index>, the index a number")
    return name, int(index)


def parse_data_path(raw: str) -> tuple[str, ShardRef]:
    """(tier, shard) of a request path; ValueError for anything that is not one (the path's
    rules are the manifest's: no `..`, no absolute path, no empty component)."""
    if not raw.startswith(PREFIX) or "?" in raw or "#" in raw:
        raise ValueError("not a data path")
    parts = raw[len(PREFIX) :].split("/", 3)
    if len(parts) != 4:
        raise ValueError("a data path is /v1/data/<tier>/<job>/<step>/<path>")
    tier, job, where, path = (unquote(p, errors="strict") for p in parts)
    step, branch = parse_step_dir(where)
    ref = ShardRef(validate_name(job), step, validate_relative_path(path), branch)
    validate_name(staged_stripe(tier)[0])
    return tier, ref


class _Body(io.RawIOBase):
    """An HTTP response body as a raw reader. A connection cut mid-body is an OSError like any
    other read error (the copy's activity fails and resumes from its heartbeat), never a short
    file: http.client ends a sized body cut off by the peer's close as if it were complete, and
    a copy would take that for a source shorter than registered, i.e. a corrupt source."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn, self._resp = conn, resp
        length = resp.getheader("Content-Length")
        self._left = int(length) if length is not None and length.isdigit() else None

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        try:
            n = self._resp.readinto(b)
        except http.client.HTTPException as exc:
            raise ConnectionError(f"peer read cut off: {exc!r}") from exc
        if self._left is not None:
            # guard: peer-cut-body-is-an-error
            if n == 0 and len(b) and self._left:
                raise ConnectionError(f"peer read cut off with {self._left} bytes still to come")
            self._left -= n
        return n

    def close(self) -> None:
        try:
            self._resp.close()
            self._conn.close()
        finally:
            super().close()


def tls_context(
    ca_bundle: Path | str | None = None,
    client_cert: Path | str | None = None,
    client_key: Path | str | None = None,
) -> ssl.SSLContext:
    """What a pull from an https data endpoint trusts: the CA bundle, or the system roots; the
    certificate must name the endpoint's host. With `client_cert` (and its key), the certificate
    the pull presents to an endpoint that requires one (mutual TLS)."""
    ctx = ssl.create_default_context(cafile=str(ca_bundle) if ca_bundle else None)
    if client_cert is not None:
        ctx.load_cert_chain(str(client_cert), str(client_key) if client_key else None)
    return ctx


def pull_tls(settings: Settings) -> ssl.SSLContext:
    """A worker's pulls from other nodes' https data endpoints: it trusts `data_tls_ca` and
    presents `data_tls_client_cert` when it has one."""
    return tls_context(
        settings.data_tls_ca, settings.data_tls_client_cert, settings.data_tls_client_key
    )


def _range_start(resp: http.client.HTTPResponse) -> int | None:
    """The first byte of a 206's `Content-Range: bytes a-b/size`."""
    unit, _, span = (resp.getheader("Content-Range") or "").partition(" ")
    first = span.partition("-")[0]
    return int(first) if unit == "bytes" and first.isdigit() else None


class PeerSource:
    """Reads one tier's shards off another node's data endpoint (a `ShardSource`)."""

    def __init__(
        self, base_url: str, tier: str, token: str | None, tls: ssl.SSLContext | None = None
    ) -> None:
        """`tls`: how an https endpoint's certificate is verified (`tls_context`)."""
        self.base_url, self.tier, self._token, self._tls = base_url, tier, token, tls

    def open_read(self, ref: ShardRef, offset: int = 0) -> BinaryIO:
        url = urlsplit(self.base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ConnectionError(f"data endpoint {self.base_url!r} is not an http(s) URL")
        conn: http.client.HTTPConnection
        if url.scheme == "https":
            conn = http.client.HTTPSConnection(
                url.hostname, url.port, timeout=READ_TIMEOUT, context=self._tls or tls_context()
            )
        else:
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=READ_TIMEOUT)
        headers = {"Range": f"bytes={offset}-"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            conn.request("GET", url.path.rstrip("/") + data_path(self.tier, ref), headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise ConnectionError(f"data endpoint {self.base_url}: {exc!r}") from exc
        if resp.status == 206 and _range_start(resp) != offset:
            conn.close()
            # Bytes from elsewhere in the file would be written at the resume offset.
            raise ConnectionError(f"data endpoint {self.base_url} answered another range")
        if resp.status in (200, 206) and (resp.status == 206 or offset == 0):
            return cast(BinaryIO, _Body(conn, resp))
        why = resp.read(512).decode("utf-8", "replace")
        conn.close()
        if resp.status == 404:
            raise FileNotFoundError(f"{self.base_url}: {ref.path!r} is not served: {why}")
        if resp.status == 416:
            # Shorter than the offset a resumed copy starts at: not the registered file.
            raise FileNotFoundError(f"{self.base_url}: {ref.path!r} is shorter than {offset}")
        if resp.status in (401, 403):
            raise PermissionError(f"data endpoint {self.base_url} refused the credential: {why}")
        raise ConnectionError(f"data endpoint {self.base_url} answered {resp.status}: {why}")
