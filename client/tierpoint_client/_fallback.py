"""What a restore reads when a copy cannot be read or its bytes do not match: another verified
copy of the shard."""

from __future__ import annotations

import contextlib
import threading
import warnings

from tierpoint_client.api import Api
from tierpoint_client.errors import ChecksumMismatchError, SourceError, TierpointError
from tierpoint_client.models import Checkpoint, LatestCheckpoint, PlanEntry, TierInfo
from tierpoint_client.sources import verified_copies


class Fallback:
    """Another source for a shard whose copy failed: a copy whose bytes did not match is
    reported (one that could not be read is not: a node down, a connection cut say nothing of
    the bytes), then the checkpoint's detail (fetched once, at the first failure) names the
    other verified copies on restorable tiers that are not quarantined, fastest first
    (`sources.verified_copies`): the first on a tier not tried yet."""

    def __init__(
        self,
        api: Api,
        latest: LatestCheckpoint,
        tiers: dict[str, TierInfo],
        node: str | None,
        only_tier: str | None = None,
    ) -> None:
        self._only_tier = only_tier
        self._api = api
        self._latest = latest
        self._tiers = list(tiers.values())
        self._node = node
        self._lock = threading.Lock()
        self._detail: Checkpoint | None = None

    def __call__(
        self, entry: PlanEntry, err: SourceError | ChecksumMismatchError, tried: frozenset[str]
    ) -> PlanEntry | None:
        job, step = self._latest.job, self._latest.step
        if isinstance(err, ChecksumMismatchError):
            reason = (
                f"restore read {err.actual_size} bytes with crc32c {err.actual_crc32c} from "
                f"{entry.location}; registered {err.expected_size} bytes, "
                f"crc32c {err.expected_crc32c}"
            )
            with contextlib.suppress(TierpointError):
                self._api.report_corrupt_copy(
                    job, step, entry.tier, entry.path, reason, branch=self._latest.checkpoint.branch
                )
        if self._only_tier is not None:
            return None
        with self._lock:
            if self._detail is None:
                self._detail = self._api.checkpoint(
                    job, step, branch=self._latest.checkpoint.branch
                )
            detail = self._detail
        shard = next((s for s in detail.shards or () if s.path == entry.path), None)
        if shard is None:
            return None
        copies = verified_copies([shard], detail.restorable_tiers(), self._tiers, self._node)
        return next((c for c in copies[shard.path] if c.tier not in tried), None)

    def report_stripe(self, entry: PlanEntry, index: int, reason: str) -> None:
        """A stripe of a coded copy whose bytes arrived whole and did not match
        (`report_stripe`); the restore goes on decoding from the other stripes."""
        latest = self._latest
        branch = latest.checkpoint.branch
        report_stripe(
            self._api, latest.job, latest.step, branch, entry, index, f"restore read {reason}"
        )


def report_stripe(
    api: Api, job: str, step: int, branch: int | None, entry: PlanEntry, index: int, reason: str
) -> None:
    """Tell the server of a stripe of the coded copy `entry` that a read left out because its
    bytes arrived whole and did not match (`reason`: who read what): the one report of a
    stripe, the restore's and `TierpointReader`'s alike. The server reads the stripe back on its
    holder before it believes it (a stripe damaged on the wire is good at rest and stays); a
    report that fails is said in a warning and let go, never failing the read that decoded
    around the stripe."""
    try:
        api.report_corrupt_copy(
            job, step, entry.tier, entry.path, reason, branch=branch, stripe=index
        )
    except (TierpointError, OSError) as e:
        warnings.warn(
            f"tierpoint: could not report stripe {index} of {job}/{step} {entry.path} on tier "
            f"{entry.tier} to the server: {e}",
            stacklevel=2,
        )
