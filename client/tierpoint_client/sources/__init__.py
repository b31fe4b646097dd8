"""Reading one copy of a file: the one place that knows what a copy's tier kind means to a reader,
which copies a reader on this node may read (`verified_copies`) and which class reads each
(`Sources.open`), and where a reader fetches only the byte ranges it needs (`ranged_read`).

The route of a `dcp.load(state, storage_reader=TierpointReader(job))`, module by module:

  torch/reader.py    read_metadata, on the coordinator only: one request (`Api.start_restore`)
                     chooses the step (the latest restorable one for this node, or `step=`),
                     takes one restore lease for the whole load and lists every copy of every
                     file and the tiers (the job's branches, the one a run then saves on, are
                     asked for beside it: torch/_choose.py).
  torch/_copies.py   CheckpointFiles: each file's copies, fastest first (`verified_copies`,
                     here), behind a copy this node keeps of it (LocalTier, same module).
                     `.metadata` is read whole (the read below). No copy of it verifies: the
                     lease is released and the next older restorable step is started instead
                     (the walk back; not with `step=`). The step and metadata go to every rank.
  torch/reader.py    DCP plans the load; prepare_global_plan, on the coordinator: each rank's
                     plan gets the copies of the files it reads, and the files its node will keep
                     are recorded (torch/_kept.py: record_kept, one request for all ranks).
  torch/reader.py    read_data, on every rank, file by file:
    torch/_load.py     FileLoad: where each byte of the file goes (a Placement: straight into
                       DCP's tensors where the layouts allow);
    torch/_copies.py   CheckpointFiles.read, copy by copy in order:
      here               Sources.open: the class that reads the copy, by its tier's kind:
                           local, shared  posix_file.FileSource: placed, positional reads on the
                                          reader threads straight into place (in order when a
                                          local copy is written as it goes);
                           peer, coded    coded_read.CodedSource: any k of the stripes from
                                          their holders, decoded into one buffer, checked;
                           peer           peer_endpoint.PeerSource: from the holder's data
                                          endpoint, in stripes of ranged GETs straight into place
                                          (32 MiB and more, no local copy written), else one GET
                                          streamed into place;
                           s3             s3_object.S3Source: one GET streamed into place, or,
                                          where `ranged_read` says so, only the items the rank
                                          needs;
      sources/placing.py every byte is verified before the read returns: the file's size and
                         crc32c (pieces hashed as they land, combined), or each item's crc32c from
                         the verified `.metadata`;
      torch/_copies.py   a mismatch or a read error: a warning, a mismatch reported to the server
                         (`Api.report_corrupt_copy`; a kept copy is deleted instead), the next
                         copy; none left: NoVerifiedCopyError, and the load fails on every rank;
                         verified: a local copy written on the way is committed (LocalTier);
    torch/_load.py     FileLoad.finish: the tensors and bytes handed to DCP.
  torch/reader.py    every rank done: a barrier, then the coordinator releases the lease.

A restore into a directory (`tierpoint restore`, `Client.restore`) goes client.py -> restore.py
(under a lease, leases.py) -> per shard `Sources.open(entry).chunks()` staged and verified ->
on a mismatch or read error, _fallback.py names the next of `verified_copies` -> destination.py
moves the verified files into place.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from tierpoint_client import s3
from tierpoint_client.errors import SourceError
from tierpoint_client.models import PlanEntry, Shard, TierInfo
from tierpoint_client.sources.base import (
    Mismatch,
    Placement,
    Pread,
    Range,
    RangedSource,
    Segment,
    Sink,
    Source,
)
from tierpoint_client.sources.coded import StripeReport
from tierpoint_client.sources.coded_read import CodedSource
from tierpoint_client.sources.peer_endpoint import PeerSource
from tierpoint_client.sources.posix_file import FileSource
from tierpoint_client.sources.s3_object import S3Source, coalesce

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = [
    "Mismatch",
    "Placement",
    "Pread",
    "Range",
    "RangedSource",
    "Segment",
    "Sink",
    "Source",
    "Sources",
    "ranged_read",
    "verified_copies",
]


class Sources:
    """Opens plan entries for reading. One boto3 client per S3 tier, made when a copy on it is
    first opened, never before: a node without an S3 tier's keys reads its local, peer or shared
    copies, and the missing keys (MissingCredentialsError, a SourceError naming what to set) fail
    only a read that reaches the S3 copy. A peer copy is read from its holder's data endpoint
    with `token` (the API token: the endpoint accepts a token whose scopes cover the job)."""

    def __init__(
        self,
        tiers: Mapping[str, TierInfo],
        token: str | None = None,
        report_stripe: StripeReport | None = None,
    ) -> None:
        """`report_stripe` is told of each stripe of a coded copy read around because its bytes
        did not match (`coded.StripeReport`)."""
        self._tiers = dict(tiers)
        self._token = token
        self._report_stripe = report_stripe

    @property
    def token(self) -> str | None:
        """The API token peer copies (and a coded copy's stripes) are read with."""
        return self._token

    def open(self, entry: PlanEntry) -> Source:
        """The source that reads `entry`; SourceError for a tier this client cannot read."""
        if entry.kind in ("local", "shared"):
            return FileSource(entry)
        # guard: coded-copy-read-by-the-reader
        if entry.code is not None:
            return CodedSource(entry, self._token, self._report_stripe)
        if entry.kind == "peer":
            return PeerSource(entry, self._token)
        if entry.kind == "s3":
            client = self._client(entry.tier)
            return S3Source(entry, self._tiers[entry.tier], client)
        raise SourceError(
            f"tier {entry.tier!r} has kind {entry.kind!r}, which this client cannot read"
        )

    def _client(self, tier: str) -> S3Client:
        # Asked of the process's clients at each open, never kept here: a Sources made before a
        # fork and used in the child gets the child's own client, not its parent's connections.
        info = self._tiers.get(tier)
        if info is None:
            raise SourceError(f"the restore plan names tier {tier!r}, which GET /v1/tiers lacks")
        return s3.client_for(info)


def verified_copies(
    shards: Iterable[Shard],
    restorable: Collection[str],
    tiers: Sequence[TierInfo],
    node: str | None,
    tier: str | None = None,
) -> dict[str, list[PlanEntry]]:
    """Per shard path, the catalog's copies of it that a reader on `node` may read, fastest
    first: its verified replicas and coded copies (`Shard.coded`) on the `restorable` tiers of
    the server's config (only `tier`, when given), in the tiers' configured order; a node-local
    replica only on its own node."""
    order = {t.name: i for i, t in enumerate(tiers)}
    kinds = {t.name: t.kind for t in tiers}

    def offered(name: str) -> bool:
        return name in kinds and name in restorable and (tier is None or name == tier)

    found: dict[str, list[PlanEntry]] = {}
    for shard in shards:
        copies = [
            PlanEntry.of_replica(shard, r, kinds[r.tier])
            for r in shard.replicas
            if r.state == "verified"
            and r.location
            and offered(r.tier)
            and (kinds[r.tier] != "local" or (node is not None and r.node == node))
        ]
        # A coded copy (stripes, not a replica) is a source in its tier's place like any other.
        copies += [c for c in shard.coded if offered(c.tier)]
        found[shard.path] = sorted(copies, key=lambda c: order[c.tier])
    return found


def ranged_read(
    source: Source, wanted: Sequence[Range], crcs: Mapping[Range, str], min_size: int
) -> RangedSource | None:
    """`source`, when a reader that needs only the `wanted` ranges of the file is to fetch only
    them: its bytes cost per request and byte (S3), the file is at least `min_size` bytes, the
    ranges (coalesced) are at most half of it, and each one's own crc32c is known (it is verified
    against it). None: the whole file is read (and verified against its own crc32c)."""
    if not isinstance(source, RangedSource) or source.entry.size < min_size:
        return None
    if any(r not in crcs for r in wanted):
        return None
    needed = sum(end - start for start, end in coalesce(wanted))
    return source if needed * 2 <= source.entry.size else None
