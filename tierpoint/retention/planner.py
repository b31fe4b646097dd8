"""The retention planner: a pure function from one job's catalog snapshot and policy to a plan.

Only copies whose marker is `restorable` are ever planned for expiry. Pending copies are in flight,
failed ones are the operator's, `expiring` ones are listed as unfinished (the executor completes
them), expired ones are gone.

Each restorable copy is decided in three passes:
1. protections (never overridden): pinned, leased, quarantined by an operator (evidence; a
   training job's quarantine only makes a copy not good and protects nothing), the latest
   restorable checkpoint on the most durable tier, a source of a copy still in flight to a more
   durable tier, a local copy not yet restorable on the more durable tier it is meant for, and
   every remnant of a checkpoint that some tier keeps but that has no good copy left;
2. the tier's keep rules (a union); copies neither protected nor kept expire, except that a
   checkpoint some tier keeps never loses its last intact copy: its most durable one stays;
3. the tier's quota: while over `max_bytes`, the oldest copies held only by keep rules expire,
   unless that would take the last good copy of a checkpoint that another tier still keeps.

A checkpoint is "kept" by a tier when the tier's rules keep its good copy there, or, when the
checkpoint is meant for the tier (promote_every) but has no good copy there yet (absent, pending,
failed, quarantined), when the rules would keep it if it had one. A tier that expired a checkpoint
no longer claims it. A checkpoint that no tier keeps may lose its last copy: the tiers' own rules,
the most durable tier's above all, said that it is not wanted anywhere.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from tierpoint.config import TierKind
from tierpoint.states import TierState

from .models import (
    PROTECTIONS,
    CheckpointInfo,
    Expiry,
    ExpiryRule,
    Keep,
    KeepReason,
    RetentionPlan,
    RetentionSnapshot,
    TierCopy,
    TierUsage,
    Unfinished,
)
from .policy import Policy, TierRef, TierRule, format_duration, promotion_targets

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_REASON_ORDER = {r: i for i, r in enumerate(KeepReason)}


def _aware(ts: datetime) -> datetime:
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def _order(c: CheckpointInfo) -> tuple[int, datetime, int]:
    """Oldest first: by step, then registration time, then id."""
    return (c.step, _aware(c.created_at), c.id)


def _time_order(c: CheckpointInfo) -> tuple[datetime, int, int]:
    return (_aware(c.created_at), c.step, c.id)


def _bucket(c: CheckpointInfo, interval: timedelta) -> int:
    return (_aware(c.created_at) - _EPOCH) // interval


def _is_good(c: CheckpointInfo, copy: TierCopy | None) -> bool:
    """A copy a job could restore from: promoted, fully verified, not quarantined."""
    return (
        copy is not None
        and copy.state == TierState.RESTORABLE
        and copy.verified
        and not copy.quarantined
        and not c.quarantined
    )


def _is_intact(copy: TierCopy | None) -> bool:
    """A copy whose bytes are safe: promoted, fully verified, the copy itself not quarantined. A
    good copy is intact; so is one of a checkpoint a training job quarantined (its bytes are
    fine, its content is what the job refused): no other copy need wait or stay for its sake."""
    return (
        copy is not None
        and copy.state == TierState.RESTORABLE
        and copy.verified
        and not copy.quarantined
    )


@dataclass
class _Tier:
    index: int
    ref: TierRef
    rule: TierRule
    good: list[CheckpointInfo]  # oldest first
    good_keys: list[tuple[int, datetime, int]] = field(default_factory=list)
    first_in_bucket: dict[int, tuple[datetime, int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.good_keys = [_order(c) for c in self.good]
        every = self.rule.keep_every
        if every is not None and every.interval is not None:
            for c in self.good:
                b = _bucket(c, every.interval)
                key = _time_order(c)
                if b not in self.first_in_bucket or key < self.first_in_bucket[b]:
                    self.first_in_bucket[b] = key

    def newer_than(self, c: CheckpointInfo) -> int:
        """How many good copies on this tier are newer than `c` (c itself not counted)."""
        return len(self.good_keys) - bisect.bisect_right(self.good_keys, _order(c))

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
        if rule.keep_within is not None and now - _aware(c.created_at) <= rule.keep_within:
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
            age = now - _aware(c.created_at)
            parts.append(
                f"keep_within={format_duration(rule.keep_within)}: {int(age.total_seconds())}s old"
            )
        if rule.keep_tags:
            parts.append(f"keep_tags={list(rule.keep_tags)}: tags {sorted(c.tags)}")
        return f"no rule of tier {self.ref.name!r} keeps step {c.step} (" + "; ".join(parts) + ")"


def plan(snapshot: RetentionSnapshot, policy: Policy, now: datetime) -> RetentionPlan:
    """What retention would do to the job's copies now. Pure and deterministic: the same snapshot
    (in any checkpoint order), policy and time give the same plan, order included."""
    now = _aware(now)
    refs = snapshot.tiers
    last = len(refs) - 1
    checkpoints = sorted(snapshot.checkpoints, key=_order)
    tiers = [
        _Tier(
            index=i,
            ref=ref,
            rule=policy.rule_for(ref.name, ref.kind, most_durable=i == last),
            good=[c for c in checkpoints if _is_good(c, c.copies.get(ref.name))],
        )
        for i, ref in enumerate(refs)
    ]
    notes = _notes(snapshot, policy)

    targets = {c.id: set(promotion_targets(policy, refs, c.step)) for c in checkpoints}
    # wants[(checkpoint id, tier index)]: the keep rules of the tier that claim the checkpoint.
    wants: dict[tuple[int, int], list[KeepReason]] = {}
    keepers: dict[int, set[int]] = {}
    for c in checkpoints:
        keepers[c.id] = set()
        # Copies flow from the fastest tier to the most durable one: a tier before the last one
        # with a marker will never receive the checkpoint if it has no marker by now.
        reached = max((t.index for t in tiers if t.ref.name in c.copies), default=-1)
        for t in tiers:
            copy = c.copies.get(t.ref.name)
            if _is_good(c, copy):
                claims = True
            elif copy is None:
                claims = t.ref.name in targets[c.id] and t.index > reached
            else:
                # Meant for this tier and not (validly) there: the tier still claims it, unless
                # it already let the checkpoint go.
                claims = t.ref.name in targets[c.id] and copy.state not in (
                    TierState.EXPIRING,
                    TierState.EXPIRED,
                )
            why = t.keeps(c, now) if claims else []
            wants[(c.id, t.index)] = why
            if why:
                keepers[c.id].add(t.index)

    latest_durable = tiers[last].good[-1].id if refs and tiers[last].good else None
    reasons: dict[tuple[int, int], list[KeepReason]] = {}
    expire: dict[tuple[int, int], Expiry] = {}

    # Passes 1 and 2: protections and keep rules.
    for t in tiers:
        for c in checkpoints:
            copy = c.copies.get(t.ref.name)
            if copy is None or copy.state != TierState.RESTORABLE:
                continue
            why = _protections(c, t, tiers, targets[c.id], keepers[c.id], latest_durable)
            why += wants[(c.id, t.index)]
            good = _is_good(c, copy)
            if why:
                reasons[(c.id, t.index)] = why
            else:
                expire[(c.id, t.index)] = Expiry(
                    checkpoint_id=c.id,
                    step=c.step,
                    tier=t.ref.name,
                    bytes=copy.bytes,
                    rule=ExpiryRule.NOT_KEPT,
                    reason=t.why_not(c, now)
                    if good
                    else f"the copy on {t.ref.name!r} is not verified, quarantined or meant for "
                    "this tier, and no rule keeps it",
                )

    # A checkpoint some tier keeps keeps its most durable good copy.
    for c in checkpoints:
        if not keepers[c.id]:
            continue
        good_on = [t.index for t in tiers if _is_intact(c.copies.get(t.ref.name))]
        if good_on and all((c.id, i) in expire for i in good_on):
            del expire[(c.id, good_on[-1])]
            reasons[(c.id, good_on[-1])] = [KeepReason.LAST_COPY]

    # Pass 3: quotas, fastest tier first.
    withdrawn: dict[int, set[int]] = {c.id: set() for c in checkpoints}
    usage = []
    for t in tiers:
        name = t.ref.name
        bytes_now = sum(c.copies[name].bytes for c in checkpoints if name in c.copies)
        leaving = sum(e.bytes for (_, i), e in expire.items() if i == t.index)
        unfinished = sum(
            c.copies[name].bytes
            for c in checkpoints
            if name in c.copies and c.copies[name].state == TierState.EXPIRING
        )
        after = bytes_now - leaving - unfinished
        quota = t.rule.max_bytes
        if quota is not None and after > quota:
            for c in checkpoints:  # oldest first
                if after <= quota:
                    break
                key = (c.id, t.index)
                held = reasons.get(key)
                if held is None or any(r in PROTECTIONS for r in held):
                    continue
                others = [
                    u.index
                    for u in tiers
                    if u.index != t.index
                    and _is_intact(c.copies.get(u.ref.name))
                    and (c.id, u.index) not in expire
                ]
                if not others and keepers[c.id] - withdrawn[c.id] - {t.index}:
                    held.insert(0, KeepReason.LAST_COPY)
                    continue
                copy = c.copies[name]
                del reasons[key]
                withdrawn[c.id].add(t.index)
                expire[key] = Expiry(
                    checkpoint_id=c.id,
                    step=c.step,
                    tier=name,
                    bytes=copy.bytes,
                    rule=ExpiryRule.MAX_BYTES,
                    reason=f"max_bytes={quota} on {name!r}: {after} bytes would remain "
                    "without this expiry; the oldest copies that no protection holds go first",
                )
                after -= copy.bytes
        usage.append(
            TierUsage(
                tier=name,
                kind=str(t.ref.kind),
                bytes_now=bytes_now,
                bytes_after=after,
                max_bytes=quota,
                quota_met=None if quota is None else after <= quota,
                over_by=0 if quota is None else max(0, after - quota),
                rule=t.rule.describe(),
            )
        )

    by_id = {c.id: c for c in checkpoints}
    position = {c.id: n for n, c in enumerate(checkpoints)}

    def order(key: tuple[int, int]) -> tuple[int, int]:
        return (key[1], position[key[0]])

    keeps = tuple(
        Keep(
            checkpoint_id=cid,
            step=by_id[cid].step,
            tier=refs[i].name,
            bytes=by_id[cid].copies[refs[i].name].bytes,
            reasons=tuple(sorted(set(reasons[(cid, i)]), key=_REASON_ORDER.__getitem__)),
        )
        for cid, i in sorted(reasons, key=order)
    )
    return RetentionPlan(
        job=snapshot.job,
        now=now,
        expiries=tuple(expire[k] for k in sorted(expire, key=order)),
        keeps=keeps,
        unfinished=tuple(
            Unfinished(
                checkpoint_id=c.id, step=c.step, tier=t.ref.name, bytes=c.copies[t.ref.name].bytes
            )
            for t in tiers
            for c in checkpoints
            if t.ref.name in c.copies and c.copies[t.ref.name].state == TierState.EXPIRING
        ),
        usage=tuple(usage),
        notes=notes,
    )


def _protections(
    c: CheckpointInfo,
    t: _Tier,
    tiers: list[_Tier],
    targets: set[str],
    keepers: set[int],
    latest_durable: int | None,
) -> list[KeepReason]:
    why = []
    if c.pinned:
        why.append(KeepReason.PINNED)
    if c.leased:
        why.append(KeepReason.LEASED)
    copy = c.copies[t.ref.name]
    if (c.quarantined and c.evidence) or (copy.quarantined and copy.evidence):
        why.append(KeepReason.QUARANTINED)
    if t.index == len(tiers) - 1 and c.id == latest_durable:
        why.append(KeepReason.LATEST_DURABLE)
    slower = tiers[t.index + 1 :]
    # A pending marker on a tier the checkpoint is not meant for (the policy changed, or a marker
    # was made for every tier) is no copy anyone waits for: it must not hold sources forever.
    if any(
        u.ref.name in c.copies
        and c.copies[u.ref.name].state == TierState.PENDING
        and u.ref.name in targets
        for u in slower
    ):
        why.append(KeepReason.IN_FLIGHT)
    if (
        t.ref.kind is TierKind.LOCAL
        and any(u.ref.name in targets and _expects(c, u.ref.name) for u in slower)
        and not any(_is_intact(c.copies.get(u.ref.name)) for u in slower)
    ):
        why.append(KeepReason.AWAITING_DURABLE)
    if keepers and not any(_is_intact(c.copies.get(u.ref.name)) for u in tiers):
        why.append(KeepReason.NO_GOOD_COPY)
    return why


def _expects(c: CheckpointInfo, tier: str) -> bool:
    """The tier has not received the checkpoint and let it go again (marker expiring/expired)."""
    copy = c.copies.get(tier)
    return copy is None or copy.state not in (TierState.EXPIRING, TierState.EXPIRED)


def _notes(snapshot: RetentionSnapshot, policy: Policy) -> tuple[str, ...]:
    names = {t.name for t in snapshot.tiers}
    notes = [
        f"the policy has rules for tier {name!r}, which is not configured"
        for name in sorted(policy.tiers)
        if name not in names
    ]
    stray: set[str] = set()
    for c in snapshot.checkpoints:
        stray.update(n for n in c.copies if n not in names)
    notes += [f"copies on unconfigured tier {n!r} are left alone" for n in sorted(stray)]
    return tuple(notes)
