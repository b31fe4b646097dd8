"""Retention policies: an admin's document refused, missing, taken or still in use."""

from __future__ import annotations

from tierpoint.errors.base import TierpointError


class InvalidPolicy(TierpointError):
    code = "invalid_policy"
    status = 422
    title = "Invalid retention policy"


class PolicyNotFound(TierpointError):
    code = "policy_not_found"
    status = 404
    title = "Retention policy not found"


class PolicyExists(TierpointError):
    code = "policy_exists"
    status = 409
    title = "A retention policy with this name exists"


class PolicyInUse(TierpointError):
    code = "policy_in_use"
    status = 409
    title = "Retention policy in use"


class PolicyConflict(TierpointError):
    code = "policy_conflict"
    status = 409
    title = "Concurrent change of the default policy"
