"""`tierpoint token bootstrap`: an install's first admin token, for a platform's secret store (its
secret alone on stdout), and nothing more on a second run, against this module's catalog."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sqlalchemy import Engine, text

from api.app import create_app
from tests.helpers.api import running_client
from tests.helpers.tokens import bearer
from tierpoint.config import Settings


def _bootstrap(url: str, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERPOINT_")}
    env.update(TIERPOINT_DATABASE_URL=url, TIERPOINT_CONFIG_FILE=os.devnull, COLUMNS="200")
    return subprocess.Popen(
        [sys.executable, "-m", "apps.cli.main", "token", "bootstrap", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run(url: str, *args: str) -> tuple[int, str, str]:
    proc = _bootstrap(url, *args)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def _admin_tokens(catalog: Engine) -> list[str]:
    with catalog.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT name FROM access_token WHERE scopes @> '[\"admin\"]'::jsonb "
                "AND revoked_at IS NULL ORDER BY name"
            )
        )
        return [r.name for r in rows]


async def test_bootstrap_makes_one_admin_token_however_often_it_runs(
    migrated_url: str, catalog: Engine, settings: Settings
) -> None:
    assert _admin_tokens(catalog) == []
    # Two at once, as two Job pods of a retried rollout might: one token.
    first, second = _bootstrap(migrated_url), _bootstrap(migrated_url)
    results = [(p.communicate(timeout=120), p.returncode) for p in (first, second)]
    assert [code for _, code in results] == [0, 0], results
    outputs = sorted(out for (out, _), _ in results)
    assert outputs[0] == "", "the second bootstrap printed a secret"
    secret = outputs[1]
    assert len(secret.splitlines()) == 1 and secret.strip() == secret.rstrip("\n")
    assert _admin_tokens(catalog) == ["admin"]

    code, out, err = _run(migrated_url)
    assert (code, out) == (0, ""), err
    assert "exists already" in err and "admin" in err
    assert _admin_tokens(catalog) == ["admin"]

    headers = bearer(secret.strip())
    app = create_app(settings.model_copy(update={"token_cache_seconds": 0}))
    async for api in running_client(app, authenticated=False):
        assert (await api.get("/v1/jobs", headers=headers)).status_code == 200
        # An admin-only route: refused for its body, not for the token's scope.
        refused = await api.post("/v1/policies", json={}, headers=headers)
        assert refused.status_code not in (401, 403), refused.text


@pytest.mark.full_stack  # runs `tierpoint token bootstrap` as a process
def test_after_the_admin_token_is_revoked_bootstrap_makes_a_new_one(
    migrated_url: str, catalog: Engine
) -> None:
    if not _admin_tokens(catalog):
        assert _run(migrated_url)[0] == 0
    with catalog.begin() as conn:
        conn.execute(text("UPDATE access_token SET revoked_at = now()"))
    # The name of a revoked token stays taken (past events name it): the new one needs its own.
    code, out, err = _run(migrated_url)
    assert code == 1 and out == "" and "exists" in err, err
    code, out, err = _run(migrated_url, "--name", "admin-2", "--expires-in", "30d")
    assert code == 0 and out.strip(), err
    assert _admin_tokens(catalog) == ["admin-2"]
