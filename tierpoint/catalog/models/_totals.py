"""Running totals the API answers from in one row: usage per job and tier (kept by triggers),
what the scrub read, and how fast each tier reads back."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    ForeignKey,
    MetaData,
    Numeric,
    String,
    TypeDecorator,
    event,
    func,
    text,
)
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.orm import Mapped, mapped_column

from tierpoint.catalog import usage_rollup
from tierpoint.catalog.models._base import Base


class ByteTotal(TypeDecorator[int]):
    """A running total of bytes: NUMERIC in the database (it cannot overflow, whatever it sums),
    an exact int in Python."""

    impl = Numeric
    cache_ok = True

    def process_result_value(self, value: Any, dialect: Dialect) -> int | None:
        return None if value is None else int(value)


class JobTierUsage(Base):
    """Bytes and checkpoints a job holds on a tier (restorable or expiring tier copies): running
    totals kept by the triggers of tierpoint/catalog/usage_rollup.py, never written by the code."""

    __tablename__ = "job_tier_usage"

    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"), primary_key=True)
    tier: Mapped[str] = mapped_column(String(128), primary_key=True)
    # Numeric: a sum over any number of checkpoints, each up to 2^53 - 1 bytes, never overflows.
    bytes: Mapped[int] = mapped_column(ByteTotal(), server_default=text("0"))
    checkpoints: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


@event.listens_for(Base.metadata, "after_create")
def _usage_triggers(target: MetaData, connection: Connection, **_: Any) -> None:
    # After every table: the triggers live on checkpoint_tier and checkpoint.
    for sql in (*usage_rollup.CREATE_FUNCTIONS, *usage_rollup.CREATE_TRIGGERS):
        connection.execute(text(sql))


class ScrubStats(Base):
    """Running totals of the scrub per tier, updated in the transaction that records what a scrub
    read, so the API answers "how much was scrubbed, what was found" from one row per tier."""

    __tablename__ = "scrub_stats"

    tier: Mapped[str] = mapped_column(String(128), primary_key=True)
    replicas: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    bytes: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    corrupt: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    lost: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    # stripes of a coded peer tier read back good (its corrupt and lost count stripes)
    stripes: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    last_scrubbed_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())


class TierReadStats(Base):
    """Bytes read back from a tier and the seconds it took, summed over the unthrottled reads of
    whole replicas (an operator's verify): the throughput a restore from the tier can expect,
    which the jobs view turns into a predicted restore time."""

    __tablename__ = "tier_read_stats"

    tier: Mapped[str] = mapped_column(String(128), primary_key=True)
    bytes: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    seconds: Mapped[float] = mapped_column(Float, server_default=text("0"))
    updated_at: Mapped[datetime] = mapped_column(server_default=func.now())
