"""A tier's keep rules (pass 2 of the planner): which of a job's good copies on the tier its
rules keep, and in words why not. The rules are a union: a copy any rule keeps is kept."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from .models import CheckpointInfo, KeepReason
from .policy import TierRef, TierRule, format_duration

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def aware(ts: datetime) -> datetime:
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def oldest_first(c: CheckpointInfo) -> tuple[bool, int, datetime, int]:
    """Oldest first: superseded checkpoints before the timeline's (a rollback left them: they
    are the first to go and never push a timeline checkpoint out of `keep_last`), then by step,
    registration time, id."""
    return (not c.superseded, c.step, aware(c.created_at), c.id)


def _time_order(c: CheckpointInfo) -> tuple[datetime, int, int]:
    return (aware(c.created_at), c.step, c.id)


def _bucket(c: CheckpointInfo, interval: timedelta) -> int:
    return (aware(c.created_at) - _EPOCH) // interval


@dataclass
class TierRules:
    """One tier (its position from the fastest, its rule) and the job's good copies on it."""

    index: int
    ref: TierRef
    rule: TierRule
    good: list[CheckpointInfo]  # oldest first
    good_keys: list[tuple[bool, int, datetime, int]] = field(default_factory=list)
    first_in_bucket: dict[int, tuple[datetime, int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.good_keys = [oldest_first(c) for c in self.good]
        every = self.rule.keep_every
        if every is not None and every.interval is not None:
            for c in self.good:
                b = _bucket(c, every.interval)
                key = _time_order(c)
                if b not in self.first_in_bucket or key < self.first_in_bucket[b]:
                    self.first_in_bucket[b] = key

    def newer_than(self, c: CheckpointInfo) -> int:
        """How many good copies on this tier are newer than `c` (c itself not counted)."""
        return len(self.good_keys) - bisect.bisect_right(self.good_keys, oldest_first(c))

    def keeps(self, c: CheckpointInfo, now: datetime) -> list[KeepReason]:
        """The keep rules of this tier that keep `c`, as if `c` had a good copy here."""
        rule = self.rule
        if not rule.has_keep_rules():
            return [KeepReason.KEEP_ALL]
        reasons = []
        if rule.keep_last is not None and self.newer_than(c) < rule.keep_last:
            reasons.append(KeepReason.KEEP_LAST)
        every = rule.keep_every
        if every is not None:
            if every.steps is not None and c.step % every.steps == 0:
                reasons.append(KeepReason.KEEP_EVERY_STEPS)
            if every.interval is not None:
                first = self.first_in_bucket.get(_bucket(c, every.interval))
                if first is None or _time_order(c) <= first:
                    reasons.append(KeepReason.KEEP_EVERY_INTERVAL)
        if rule.keep_within is not None and now - aware(c.created_at) <= rule.keep_within:
            reasons.append(KeepReason.KEEP_WITHIN)
        if rule.keep_tags and not c.tags.isdisjoint(rule.keep_tags):
            reasons.append(KeepReason.KEEP_TAGS)
        return reasons

    def why_not(self, c: CheckpointInfo, now: datetime) -> str:
        rule = self.rule
        parts = []
        if rule.keep_last is not None:
            parts.append(f"keep_last={rule.keep_last}: {self.newer_than(c)} newer")
        every = rule.keep_every
        if every is not None:
            if every.steps is not None:
                parts.append(f"keep_every.steps={every.steps}: step {c.step} is not a multiple")
            if every.interval is not None:
                parts.append(
                    f"keep_every.interval={format_duration(every.interval)}: "
                    "an older checkpoint holds its interval"
                )
        if rule.keep_within is not None:
            age = now - aware(c.created_at)
            parts.append(
                f"keep_within={format_duration(rule.keep_within)}: {int(age.total_seconds())}s old"
            )
        if rule.keep_tags:
            parts.append(f"keep_tags={list(rule.keep_tags)}: tags {sorted(c.tags)}")
        return f"no rule of tier {self.ref.name!r} keeps step {c.step} (" + "; ".join(parts) + ")"
