"""`tierpoint token create|list|revoke` as an admin runs them: separate processes against this
module's catalog, and the tokens they make used against the real app."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from api.app import create_app
from tests.helpers.api import running_client
from tests.helpers.tokens import bearer
from tierpoint.config import Settings


@dataclass
class Run:
    code: int
    out: str
    err: str


TokenCli = Callable[..., Run]


@pytest.fixture
def token_cli(migrated_url: str) -> TokenCli:
    def run(*args: str) -> Run:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIERPOINT_")}
        env.update(
            TIERPOINT_DATABASE_URL=migrated_url,
            TIERPOINT_CONFIG_FILE=os.devnull,
            COLUMNS="200",
            NO_COLOR="1",
        )
        p = subprocess.run(
            [sys.executable, "-m", "apps.cli.main", "token", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return Run(p.returncode, p.stdout, p.stderr)

    return run


def _row(catalog: Engine, name: str) -> dict[str, Any]:
    with catalog.connect() as conn:
        row = conn.execute(text("SELECT * FROM access_token WHERE name = :n"), {"n": name}).one()
        return dict(row._mapping)


def _lifetime(row: dict[str, Any]) -> timedelta:
    lifetime: timedelta = row["expires_at"] - row["created_at"]
    return lifetime


@pytest.mark.full_stack  # runs `tierpoint token` as a process
def test_create_prints_the_secret_once_and_stores_its_digest(
    token_cli: TokenCli, catalog: Engine
) -> None:
    run = token_cli
    name = f"trainer-{uuid.uuid4().hex[:6]}"
    made: Run = run("create", name, "--scope", "train:llama-", "--scope", "read")
    assert made.code == 0, made.err
    secret = made.out.strip()
    assert made.out == secret + "\n" and secret.startswith("tp_") and len(secret) == 46
    assert name in made.err and "only this once" in made.err and secret not in made.err
    row = _row(catalog, name)
    assert row["digest"] == hashlib.sha256(secret.encode()).hexdigest()
    assert row["scopes"] == ["read", "train:llama-"]
    assert _lifetime(row) == timedelta(days=90)
    assert secret not in str(row)

    never = f"ci-{uuid.uuid4().hex[:6]}"
    assert run("create", never, "--scope", "read", "--expires-in", "never").code == 0
    assert _row(catalog, never)["expires_at"] is None
    short = f"ci-{uuid.uuid4().hex[:6]}"
    assert run("create", short, "--scope", "read", "--expires-in", "12h").code == 0
    row = _row(catalog, short)
    assert _lifetime(row) == timedelta(hours=12)

    listed: Run = run("list")
    assert listed.code == 0, listed.err
    line = next(x for x in listed.out.splitlines() if name in x)
    assert "read train:llama-" in line and "active" in line
    assert secret not in listed.out and str(row["digest"]) not in listed.out
    assert "tp_" not in listed.out


@pytest.mark.full_stack  # runs `tierpoint token` as a process
def test_refusals_change_nothing(token_cli: TokenCli, catalog: Engine) -> None:
    run = token_cli
    name = f"dup-{uuid.uuid4().hex[:6]}"
    assert run("create", name, "--scope", "read").code == 0
    with catalog.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM access_token")).scalar_one()
    for args, code, says in [
        (("create", name, "--scope", "admin"), 1, "token_exists"),
        (("create", "new-one", "--scope", "write"), 1, "invalid_scope"),
        (("create", "new-one", "--scope", "train:"), 1, "invalid_scope"),
        (("create", "bad name", "--scope", "read"), 1, "validation_error"),
        (("create", "new-one", "--scope", "read", "--expires-in", "soon"), 2, "90d"),
        (("create", "new-one"), 2, "--scope"),
        (("revoke", "no-such-token"), 1, "token_not_found"),
    ]:
        r: Run = run(*args)
        assert r.code == code, (args, r.out, r.err)
        assert says in r.out + r.err, (args, r.out, r.err)
        assert "tp_" not in r.out + r.err
    with catalog.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM access_token")).scalar_one() == before
    assert _row(catalog, name)["scopes"] == ["read"]


async def test_a_created_token_works_until_it_is_revoked(
    token_cli: TokenCli, catalog: Engine, settings: Settings, nodes: tuple[str, str]
) -> None:
    run = token_cli
    name = f"oncall-{uuid.uuid4().hex[:6]}"
    made: Run = run("create", name, "--scope", "operate", "--scope", "read")
    headers = bearer(made.out.strip())
    app = create_app(settings.model_copy(update={"token_cache_seconds": 0}))
    async for api in running_client(app, authenticated=False):
        assert (await api.get("/v1/jobs", headers=headers)).status_code == 200
        assert (await api.post("/v1/policies", json={}, headers=headers)).status_code == 403

        revoked: Run = run("revoke", name)
        assert revoked.code == 0 and "revoked" in revoked.out, revoked.err
        again: Run = run("revoke", name)
        assert again.code == 0 and "already revoked" in again.out, again.err

        r = await api.get("/v1/jobs", headers=headers)
        assert r.status_code == 401 and r.json()["code"] == "token_revoked"
    listed: Run = run("list")
    assert "revoked" in next(x for x in listed.out.splitlines() if name in x)
    assert _row(catalog, name)["last_used_at"] is not None
