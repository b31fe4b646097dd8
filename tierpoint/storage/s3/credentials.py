"""Whose keys an S3 tier signs with: the standard AWS chain (environment, profile, instance role),
unless the tier names a profile of its own (`credentials_profile`) or an environment prefix
(`credentials_env`), so that a process with two S3 endpoints (a dev stack's own S3 beside a real
one, a worker writing to two object stores) gives each endpoint its own keys instead of one set
for both. Only the names are settings; the keys stay in the environment or the AWS files."""

from __future__ import annotations

import hashlib
import os

import boto3

from tierpoint.tier_config import TierConfig


class MissingTierCredentials(ValueError):
    """The tier names an environment prefix whose variables are not set."""


def env_names(prefix: str) -> tuple[str, str, str]:
    """The variables a tier with `credentials_env = prefix` reads: key id, secret, session token
    (optional)."""
    return (f"{prefix}_ACCESS_KEY_ID", f"{prefix}_SECRET_ACCESS_KEY", f"{prefix}_SESSION_TOKEN")


def _env_keys(tier: TierConfig) -> tuple[str, str, str | None] | None:
    if tier.credentials_env is None:
        return None
    key_var, secret_var, token_var = env_names(tier.credentials_env)
    key, secret = os.environ.get(key_var), os.environ.get(secret_var)
    # guard: tier-credentials-never-fall-back
    if not key or not secret:
        # Never the standard chain instead: those are another endpoint's keys (the very mix-up
        # this setting exists to prevent).
        raise MissingTierCredentials(
            f"tier {tier.name!r} takes its S3 keys from {key_var} and {secret_var} "
            f"(credentials_env = {tier.credentials_env!r}), and they are not both set"
        )
    return key, secret, os.environ.get(token_var) or None


def tier_session(tier: TierConfig) -> boto3.session.Session:
    """A new boto3 session signing with the tier's credentials (sessions are not thread-safe:
    one per client)."""
    keys = _env_keys(tier)
    if keys is not None:
        key, secret, token = keys
        return boto3.session.Session(
            aws_access_key_id=key, aws_secret_access_key=secret, aws_session_token=token
        )
    return boto3.session.Session(profile_name=tier.credentials_profile)


def credentials_identity(tier: TierConfig) -> tuple[str | None, str | None, str | None]:
    """What tells apart two tiers' credentials, for caching a client per credentials: the
    profile, the prefix and a digest of the keys it points at now (never the keys themselves)."""
    keys = _env_keys(tier)
    digest = None
    if keys is not None:
        digest = hashlib.sha256("\0".join(k or "" for k in keys).encode()).hexdigest()
    return tier.credentials_profile, tier.credentials_env, digest
