"""The retention planner: a pure function from one job's catalog snapshot and policy to a plan.

Only restorable tier copies are ever planned for expiry, and failed copies on the nodes' own tiers
(local, peer) that a node declared lost took part of (`on_lost_node`: its replicas there are gone,
the rest are bytes on nodes not lost that no restore is sent to), unless re-replication or repair
is making them again (`rebuild_from`). Pending copies are in flight, as failed ones being made
again are, other failed ones are the operator's, `expiring` ones are listed as unfinished (the
executor completes them), expired ones are gone.

Each such copy is decided in three passes (a failed copy is never intact, so it is never the last
copy that pass 2 keeps, and a checkpoint with no intact copy keeps it as a remnant):
1. protections, never overridden (protections.py: pinned, leased, an operator's quarantine, the
   latest on the most durable tier, sources of copies in flight or being made again, ...);
2. the tier's keep rules (a union, keep_rules.py: `TierRules`); copies neither protected nor
   kept expire, except that a checkpoint some tier keeps never loses its last intact copy: its
   most durable one stays;
3. the tier's quota: while over `max_bytes`, the oldest copies held only by keep rules expire,
   unless that would take the last good copy of a checkpoint that another tier still keeps.

A checkpoint is "kept" by a tier when the tier's rules keep its good copy there, or, when the
checkpoint is meant for the tier (promote_every) but has no good copy there yet (absent, pending,
failed, quarantined), when the rules would keep it if it had one. A tier that expired a checkpoint
no longer claims it. A checkpoint that no tier keeps may lose its last copy: the tiers' own rules,
the most durable tier's above all, said that it is not wanted anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from tierpoint.states import TierState

from .keep_rules import TierRules, aware, oldest_first
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
from .policy import Policy, promotion_targets
from .protections import decided, is_good, is_intact, newest_good, protections

_REASON_ORDER = {r: i for i, r in enumerate(KeepReason)}


def plan(snapshot: RetentionSnapshot, policy: Policy, now: datetime) -> RetentionPlan:
    """What retention would do to the job's copies now. Pure and deterministic: the same snapshot
    (in any checkpoint order), policy and time give the same plan, order included."""
    planning = _Planning.start(snapshot, policy, aware(now))
    planning.protect_and_keep()
    planning.keep_last_copies()
    usage = tuple(planning.apply_quota(t) for t in planning.tiers)
    return planning.result(snapshot.job, usage, _notes(snapshot, policy))


@dataclass
class _Planning:
    """One plan in the making: what each tier claims, and the decisions of the passes so far.
    Keys are (checkpoint id, tier index)."""

    now: datetime
    checkpoints: list[CheckpointInfo]  # oldest first
    tiers: list[TierRules]
    targets: dict[int, set[str]]  # the tiers each checkpoint is meant for (promote_every)
    # The keep rules of a tier that claim a checkpoint, and the tiers that keep each checkpoint.
    wants: dict[tuple[int, int], list[KeepReason]] = field(default_factory=dict)
    keepers: dict[int, set[int]] = field(default_factory=dict)
    reasons: dict[tuple[int, int], list[KeepReason]] = field(default_factory=dict)
    expire: dict[tuple[int, int], Expiry] = field(default_factory=dict)
    # Tiers whose quota took a checkpoint's copy: they no longer claim it.
    withdrawn: dict[int, set[int]] = field(default_factory=dict)

    @classmethod
    def start(cls, snapshot: RetentionSnapshot, policy: Policy, now: datetime) -> _Planning:
        refs = snapshot.tiers
        checkpoints = sorted(snapshot.checkpoints, key=oldest_first)
        tiers = [
            TierRules(
                index=i,
                ref=ref,
                rule=rule,
                good=[c for c in checkpoints if is_good(c, c.copies.get(ref.name))],
            )
            for i, (ref, rule) in enumerate(zip(refs, policy.rules(refs), strict=True))
        ]
        targets = {c.id: set(promotion_targets(policy, refs, c.step)) for c in checkpoints}
        planning = cls(now, checkpoints, tiers, targets)
        for c in checkpoints:
            planning.claim(c)
        return planning

    def claim(self, c: CheckpointInfo) -> None:
        """Which tiers keep `c`, and by which rules."""
        self.keepers[c.id] = set()
        self.withdrawn[c.id] = set()
        # Copies flow from the fastest tier to the most durable one: a tier before the last one
        # with a tier copy will never receive the checkpoint if it has no tier copy by now.
        reached = max((t.index for t in self.tiers if t.ref.name in c.copies), default=-1)
        for t in self.tiers:
            copy = c.copies.get(t.ref.name)
            if is_good(c, copy):
                claims = True
            elif copy is None:
                claims = t.ref.name in self.targets[c.id] and t.index > reached
            else:
                # Meant for this tier and not (validly) there: the tier still claims it, unless
                # it already let the checkpoint go.
                claims = t.ref.name in self.targets[c.id] and copy.state not in (
                    TierState.EXPIRING,
                    TierState.EXPIRED,
                )
            why = t.keeps(c, self.now) if claims else []
            self.wants[(c.id, t.index)] = why
            if why:
                self.keepers[c.id].add(t.index)

    def protect_and_keep(self) -> None:
        """Passes 1 and 2: every restorable copy is protected, kept by its tier's rules, or
        expires."""
        tiers = self.tiers
        last = tiers[-1] if tiers else None
        latest_durable = last.good[-1].id if last is not None and last.good else None
        newest_good_id = newest_good(self.checkpoints)
        for t in tiers:
            for c in self.checkpoints:
                copy = c.copies.get(t.ref.name)
                if copy is None or not decided(t.ref.kind, copy):
                    continue
                key = (c.id, t.index)
                refs = [u.ref for u in tiers]
                why = protections(
                    c,
                    t.index,
                    refs,
                    self.targets[c.id],
                    self.keepers[c.id],
                    latest_durable,
                    newest_good_id,
                )
                why += self.wants[key]
                if why:
                    self.reasons[key] = why
                    continue
                self.expire[key] = Expiry(
                    checkpoint_id=c.id,
                    step=c.step,
                    tier=t.ref.name,
                    bytes=copy.bytes,
                    rule=ExpiryRule.NOT_KEPT,
                    reason=_why_expires(c, t, copy, self.now),
                )

    def lasts(self, key: tuple[int, int]) -> bool:
        """The copy stays beyond this plan: not expiring, and kept by more than a rebuild's hold
        (which ends with the rebuild: it never stands in for a checkpoint's lasting copy)."""
        why = self.reasons.get(key)
        # guard: planner-hold-is-no-last-copy
        return key not in self.expire and bool(why) and why != [KeepReason.REBUILD_SOURCE]

    def keep_last_copies(self) -> None:
        """A checkpoint some tier keeps keeps its most durable intact copy."""
        expire, reasons = self.expire, self.reasons
        for c in self.checkpoints:
            if not self.keepers[c.id]:
                continue
            good_on = [t.index for t in self.tiers if is_intact(c.copies.get(t.ref.name))]
            if good_on and not any(self.lasts((c.id, i)) for i in good_on):
                last = (c.id, good_on[-1])
                # guard: planner-last-copy
                expire.pop(last, None)
                reasons[last] = [KeepReason.LAST_COPY, *reasons.get(last, ())]

    def apply_quota(self, t: TierRules) -> TierUsage:
        """Pass 3, one tier at a time, fastest first: while the tier is over its quota, the
        oldest copies only keep rules hold expire."""
        name = t.ref.name
        held = [c for c in self.checkpoints if name in c.copies]
        bytes_now = sum(c.copies[name].bytes for c in held)
        leaving = sum(e.bytes for (_, i), e in self.expire.items() if i == t.index)
        unfinished = sum(
            c.copies[name].bytes for c in held if c.copies[name].state == TierState.EXPIRING
        )
        after = bytes_now - leaving - unfinished
        quota = t.rule.max_bytes
        if quota is not None and after > quota:
            after = self._expire_over_quota(t, quota, after)
        return TierUsage(
            tier=name,
            kind=str(t.ref.kind),
            bytes_now=bytes_now,
            bytes_after=after,
            max_bytes=quota,
            quota_met=None if quota is None else after <= quota,
            over_by=0 if quota is None else max(0, after - quota),
            rule=t.rule.describe(),
        )

    def _expire_over_quota(self, t: TierRules, quota: int, after: int) -> int:
        """Expire the oldest copies on `t` that no protection holds until `after` (the bytes the
        tier keeps) meets `quota`, except a last intact copy another tier still wants. Returns
        the bytes left."""
        for c in self.checkpoints:  # oldest first
            if after <= quota:
                break
            key = (c.id, t.index)
            held = self.reasons.get(key)
            if held is None or any(r in PROTECTIONS for r in held):
                continue
            others = [
                u.index
                for u in self.tiers
                if u.index != t.index
                and is_intact(c.copies.get(u.ref.name))
                and self.lasts((c.id, u.index))
            ]
            if not others and self.keepers[c.id] - self.withdrawn[c.id] - {t.index}:
                # guard: planner-last-copy-quota
                held.insert(0, KeepReason.LAST_COPY)
                continue
            copy = c.copies[t.ref.name]
            del self.reasons[key]
            self.withdrawn[c.id].add(t.index)
            self.expire[key] = Expiry(
                checkpoint_id=c.id,
                step=c.step,
                tier=t.ref.name,
                bytes=copy.bytes,
                rule=ExpiryRule.MAX_BYTES,
                reason=f"max_bytes={quota} on {t.ref.name!r}: {after} bytes would remain "
                "without this expiry; the oldest copies that no protection holds go first",
            )
            after -= copy.bytes
        return after

    def result(
        self, job: str, usage: tuple[TierUsage, ...], notes: tuple[str, ...]
    ) -> RetentionPlan:
        """The decisions in a stable order: by tier, then oldest checkpoint first."""
        by_id = {c.id: c for c in self.checkpoints}
        position = {c.id: n for n, c in enumerate(self.checkpoints)}

        def order(key: tuple[int, int]) -> tuple[int, int]:
            return (key[1], position[key[0]])

        names = [t.ref.name for t in self.tiers]
        keeps = tuple(
            Keep(
                checkpoint_id=cid,
                step=by_id[cid].step,
                tier=names[i],
                bytes=by_id[cid].copies[names[i]].bytes,
                reasons=tuple(sorted(set(self.reasons[(cid, i)]), key=_REASON_ORDER.__getitem__)),
            )
            for cid, i in sorted(self.reasons, key=order)
        )
        return RetentionPlan(
            job=job,
            now=self.now,
            expiries=tuple(self.expire[k] for k in sorted(self.expire, key=order)),
            keeps=keeps,
            unfinished=tuple(
                Unfinished(checkpoint_id=c.id, step=c.step, tier=name, bytes=c.copies[name].bytes)
                for name in names
                for c in self.checkpoints
                if name in c.copies and c.copies[name].state == TierState.EXPIRING
            ),
            usage=usage,
            notes=notes,
        )


def _why_expires(c: CheckpointInfo, t: TierRules, copy: TierCopy, now: datetime) -> str:
    if copy.state == TierState.FAILED:
        return f"the copy on {t.ref.name!r} failed; {t.why_not(c, now)}"
    if is_good(c, copy):
        return t.why_not(c, now)
    return (
        f"the copy on {t.ref.name!r} is not verified, quarantined or meant for this tier, and no "
        "rule keeps it"
    )


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
    rules = dict(zip((t.name for t in snapshot.tiers), policy.rules(snapshot.tiers), strict=True))
    notes += [
        f"peer tier {peer!r} has no rule in this policy: it keeps what {local!r} keeps "
        f"({rules[peer].describe()}); give it one under tiers or kinds.peer to change that"
        for peer, local in policy.inherited(snapshot.tiers).items()
    ]
    return tuple(notes)
