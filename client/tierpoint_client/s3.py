"""The client's S3 reads: one boto3 client per process and endpoint, with the retries a restart
needs, and a botocore body read straight into the caller's memory."""

from __future__ import annotations

import http.client
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tierpoint_client.errors import MissingCredentialsError, MissingDependencyError
from tierpoint_client.models import TierInfo
from tierpoint_client.transport import sized_readinto

if TYPE_CHECKING:
    import boto3
    from mypy_boto3_s3 import S3Client


def readinto_of(body: Any) -> Callable[[memoryview], int]:
    """The fastest `readinto` of a botocore body: its HTTP response's own (the socket's bytes
    straight into the caller's memory) when nothing sits between them (urllib3's readinto reads
    into a new bytes object, then copies it); else the body's. A body cut off before its
    Content-Length raises an HTTPException either way."""
    raw = getattr(body, "_raw_stream", None)
    fp = getattr(raw, "_fp", None)
    if (
        raw is not None
        and isinstance(fp, http.client.HTTPResponse)
        and not raw.headers.get("Content-Encoding")
        and not len(raw._decoded_buffer)
    ):
        return sized_readinto(fp)
    from botocore.exceptions import BotoCoreError

    readinto = getattr(body, "readinto", None)  # botocore's StreamingBody has it since 1.36

    def through_body(view: memoryview) -> int:
        try:
            if readinto is not None:
                n: int = readinto(view)
                return n
            data = body.read(len(view))
        except BotoCoreError as e:  # IncompleteReadError, ResponseStreamingError
            raise http.client.HTTPException(str(e)) from e
        view[: len(data)] = data
        return len(data)

    return through_body


def release(body: Any) -> None:
    """Close a body read to its end without an error; its connection goes back to botocore's
    pool when its response was read to its Content-Length past urllib3, which would close it
    (and the next object would cost a new TCP and TLS handshake)."""
    raw = getattr(body, "_raw_stream", None)
    fp = getattr(raw, "_fp", None)
    if (
        raw is not None
        and isinstance(fp, http.client.HTTPResponse)
        and fp.isclosed()
        and not fp.length
        and not fp.will_close
    ):
        raw.release_conn()
    body.close()


# Adaptive retries by default: a restart is every rank reading at once, which is when S3 answers
# 503 SlowDown, and adaptive mode slows each client's own request rate until it stops.
RETRIES: dict[str, Any] = {"mode": "adaptive", "total_max_attempts": 9}


def _retries(session: Any) -> dict[str, Any]:
    """RETRIES, but the AWS SDK's own settings win where given (AWS_RETRY_MODE, AWS_MAX_ATTEMPTS
    or the profile's retry_mode, max_attempts): botocore fills in what the dict leaves out."""
    scoped = session._session.get_scoped_config()
    out = dict(RETRIES)
    if os.environ.get("AWS_RETRY_MODE") or scoped.get("retry_mode"):
        del out["mode"]
    if os.environ.get("AWS_MAX_ATTEMPTS") or scoped.get("max_attempts"):
        del out["total_max_attempts"]
    return out


_S3_CLIENTS: dict[tuple[Any, ...], S3Client] = {}
_S3_CLIENTS_LOCK = threading.Lock()


def _forget_clients() -> None:
    """In a forked child: the parent's clients keep its connections, which a child's requests
    would share with the parent's (two readers of one socket). The child makes its own; a new
    lock, as a parent's thread may have held this one at the fork."""
    global _S3_CLIENTS, _S3_CLIENTS_LOCK
    _S3_CLIENTS, _S3_CLIENTS_LOCK = {}, threading.Lock()


# guard: fork-forgets-s3-clients
os.register_at_fork(after_in_child=_forget_clients)


def client_for(info: TierInfo) -> S3Client:
    """The process's client for the tier's endpoint: made once and shared (boto3's clients are
    thread-safe; making one reads botocore's endpoint and service models, which cost a large
    part of a small load). A new one in a forked child, or when the AWS settings in the
    environment (credentials, profile, retries) have changed."""
    aws = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    who = (info.credentials_profile, info.credentials_env, _tier_env(info))
    key = (info.endpoint_url, info.region, aws, who)
    with _S3_CLIENTS_LOCK:
        client = _S3_CLIENTS.get(key)
        if client is None:
            client = _S3_CLIENTS[key] = _new_client(info)
        return client


def _tier_env(info: TierInfo) -> tuple[str | None, ...]:
    """The keys of a tier that names an environment prefix (`credentials_env`): key id, secret
    and session token, as the server's tier reads them."""
    if not info.credentials_env:
        return ()
    p = info.credentials_env
    return tuple(os.environ.get(f"{p}_{n}") for n in CREDENTIAL_NAMES)


CREDENTIAL_NAMES = ("ACCESS_KEY_ID", "SECRET_ACCESS_KEY", "SESSION_TOKEN")


def _session(info: TierInfo) -> boto3.session.Session:
    """A boto3 session with the tier's credentials: its environment prefix, its profile, or the
    standard AWS chain. A prefix whose variables are missing is an error, never the chain (those
    keys are another endpoint's)."""
    import boto3

    if info.credentials_env:
        key, secret, token = _tier_env(info)
        if not key or not secret:
            p = info.credentials_env
            raise MissingCredentialsError(
                f"tier {info.name!r} is read with the keys in {p}_ACCESS_KEY_ID and "
                f"{p}_SECRET_ACCESS_KEY, which this process's environment lacks: set both to "
                "read its copies"
            )
        return boto3.session.Session(
            aws_access_key_id=key, aws_secret_access_key=secret, aws_session_token=token
        )
    return boto3.session.Session(profile_name=info.credentials_profile)


def _new_client(info: TierInfo) -> S3Client:
    try:
        import boto3  # noqa: F401  (the dependency `_session` uses)
        from botocore.config import Config
    except ImportError:
        raise MissingDependencyError(
            "restoring from an S3 tier needs boto3: pip install 'tierpoint-client[s3]'"
        ) from None
    session = _session(info)
    settings: dict[str, Any] = {
        "retries": _retries(session),
        # More than botocore's 10: the restore's workers and the ranged reads of the torch
        # reader share this client.
        "max_pool_connections": 32,
        "tcp_keepalive": True,
    }
    try:
        # Every shard is checked against its registered crc32c here; botocore checking a
        # checksum of its own as well would only add a pass over the bytes.
        config = Config(**settings, response_checksum_validation="when_required")
    except TypeError:  # botocore < 1.36 has no such setting, and validates only when asked
        config = Config(**settings)
    client: S3Client = session.client(
        "s3", endpoint_url=info.endpoint_url, region_name=info.region, config=config
    )
    return client
