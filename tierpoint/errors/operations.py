"""The service's dependencies and an operator's actions on copies: readiness, Temporal, retries,
verifications, repairs, reconciliations, the node data endpoint's reads."""

from __future__ import annotations

from tierpoint.errors.base import TierpointError


class NotReady(TierpointError):
    code = "not_ready"
    status = 503
    title = "Service not ready"


class CatalogUnavailable(TierpointError):
    code = "catalog_unavailable"
    status = 503
    title = "Catalog unavailable"


class TemporalUnavailable(TierpointError):
    code = "temporal_unavailable"
    status = 503
    title = "Temporal unavailable"


class NothingToRetry(TierpointError):
    code = "nothing_to_retry"
    status = 409
    title = "Nothing to retry"


class NoVerifiedSource(TierpointError):
    """A retry whose lifecycle run could never finish: a tier it must copy from holds no verified
    copy any more (expired by retention, lost, corrupt)."""

    code = "no_verified_source"
    status = 409
    title = "No verified copy left to retry from"


class CopyOnLostNode(TierpointError):
    """A retry that cannot help: the failed copy is on a tier local to a node declared lost, whose
    bytes no run can read or write again (the checkpoint's other tiers still serve restores)."""

    code = "copy_on_lost_node"
    status = 409
    title = "The failed copy was on a node declared lost"


class RepairInProgress(TierpointError):
    """A retry while a repair (or a re-replication) is copying the failed copy back: the repair
    promotes it when done, and a second run would copy the same shards beside it."""

    code = "repair_in_progress"
    status = 409
    title = "A repair is copying this copy back"


class NothingToAcknowledge(TierpointError):
    code = "nothing_to_acknowledge"
    status = 409
    title = "No unacknowledged failure"


class NothingToVerify(TierpointError):
    code = "nothing_to_verify"
    status = 409
    title = "Nothing to verify"


class CopyNotFound(TierpointError):
    code = "copy_not_found"
    status = 404
    title = "No such copy of the checkpoint"


class InvalidDataPath(TierpointError):
    """A node data endpoint request whose path is not `/v1/data/<tier>/<job>/<step>/<path>`
    under the manifest's path rules."""

    code = "invalid_data_path"
    status = 400
    title = "Not a data endpoint path"


class RangeNotSatisfiable(TierpointError):
    code = "range_not_satisfiable"
    status = 416
    title = "Range not satisfiable"


class CopyDamaged(TierpointError):
    """A node data endpoint found the copy it was asked for not the registered size (or gone):
    it serves none of it, marks it bad and asks for its repair."""

    code = "copy_damaged"
    status = 404
    title = "The copy on this node is damaged"


class ReconcileNotFound(TierpointError):
    code = "reconcile_not_found"
    status = 404
    title = "No such reconciliation run"
