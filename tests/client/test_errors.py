"""Client errors survive pickling with their fields (DCP gathers a rank's error to the
coordinator through pickle)."""

from __future__ import annotations

import pickle

from tierpoint_client.errors import AuthError, error_for


def test_an_api_error_pickles_with_its_problem() -> None:
    problem = {"code": "insufficient_scope", "required_scope": "train:gpt-x"}
    err = error_for(403, "insufficient_scope", "token 'x' may not do this", problem)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is AuthError
    assert (back.status, back.code, back.detail, back.problem) == (
        403,
        "insufficient_scope",
        "token 'x' may not do this",
        problem,
    )
    assert str(back) == str(err)
