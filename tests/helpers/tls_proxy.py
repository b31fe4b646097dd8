"""A Temporal frontend that requires mutual TLS, for tests: a certificate authority made here, and
a TLS-terminating TCP proxy in front of the suite's Temporal dev server (which has no TLS option
of its own). The proxy decrypts and forwards the bytes unchanged: gRPC's HTTP/2 runs end to end,
so it needs no HTTP/2 of its own, only ALPN `h2` in the handshake, as Temporal Cloud offers it."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVER_NAME = "temporal.tierpoint.test"


@dataclass(frozen=True)
class Pki:
    """PEM files: the CA, the server's certificate and key, a client's certificate and key."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_name: str


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(
    subject: str,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    server: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    issuer_name, issuer_key = issuer or (_name(subject), key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is None:
        usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
        builder = builder.add_extension(usage, critical=True).add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    else:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
        purpose = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
    if server:
        names = [x509.DNSName(SERVER_NAME), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256()), key


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def make_pki(directory: Path, client_name: str = "tierpoint") -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = _issue("tierpoint test CA", None)
    server_cert, server_key = _issue(SERVER_NAME, (ca_cert.subject, ca_key), server=True)
    client_cert, client_key = _issue(client_name, (ca_cert.subject, ca_key))
    ca_path, _ = _write(directory, "ca", ca_cert, ca_key)
    server_paths = _write(directory, "server", server_cert, server_key)
    client_paths = _write(directory, "client", client_cert, client_key)
    return Pki(ca_path, *server_paths, *client_paths, client_name)


@dataclass
class TlsProxy:
    """Listens on 127.0.0.1:`port` with the server certificate, admits only clients with a
    certificate of the CA, and forwards each connection to `backend` (host:port)."""

    pki: Pki
    backend: str
    port: int = 0
    # Common names of the client certificates of accepted connections, in order.
    clients: list[str] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.pki.ca))
        ctx.load_cert_chain(self.pki.server_cert, self.pki.server_key)
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.set_alpn_protocols(["h2"])
        return ctx

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ssl.SSLError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError, ssl.SSLError, RuntimeError):
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peercert") or {}
        subject = dict(x[0] for x in peer.get("subject", ()))
        self.clients.append(str(subject.get("commonName")))
        host, port = self.backend.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def start(self) -> None:
        started = threading.Event()
        loop = asyncio.new_event_loop()
        self._loop = loop

        async def serve() -> None:
            server = await asyncio.start_server(
                self._handle, "127.0.0.1", self.port, ssl=self._context()
            )
            self.port = server.sockets[0].getsockname()[1]
            started.set()
            async with server:
                await server.serve_forever()

        def run() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(serve())

        self._thread = threading.Thread(target=run, name="tls-proxy", daemon=True)
        self._thread.start()
        if not started.wait(30):
            raise TimeoutError("the TLS proxy did not start")

    def stop(self) -> None:
        if self._loop is not None:
            for task in asyncio.all_tasks(self._loop):
                self._loop.call_soon_threadsafe(task.cancel)
        if self._thread is not None:
            self._thread.join(10)


@contextlib.contextmanager
def tls_proxy(pki: Pki, backend: str) -> Iterator[TlsProxy]:
    proxy = TlsProxy(pki, backend)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()
