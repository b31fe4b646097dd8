"""The client's errors survive pickling with their fields: torch.distributed.checkpoint pickles
the exception of the rank that failed to raise it on every other rank (and gathers it to the
coordinator)."""

from __future__ import annotations

import pickle

import pytest
from tierpoint_client import errors
from tierpoint_client.errors import AuthError, error_for

CASES = [
    errors.error_for(409, "checkpoint_conflict", "j/1 is registered", {"code": "x"}),
    errors.error_for(404, "job_not_found", None, None),
    errors.ApiError(418, None, "teapot"),
    errors.CheckpointFailedError("j", 1, "s3", "failed", None),
    errors.ChecksumMismatchError("a/b", "s3://b/k", 10, 9, "0000000a", "0000000b"),
    errors.TransportError("refused"),
    errors.NoVerifiedCopyError("j", 3, "a/b", ["ssd copy could not be read: gone"]),
    errors.NoVerifiedCopyError(None, None, "a/b", []),
    errors.DestinationNotEmptyError("/restore", ["x.bin"], 4),
]


@pytest.mark.parametrize("error", CASES, ids=lambda e: type(e).__name__)
def test_an_error_pickles_to_an_equal_one(error: errors.TierpointError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert vars(copy) == vars(error)


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
