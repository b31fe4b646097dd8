"""The planner's safety rules, restated independently of the planner (simple, quadratic code) so
that property tests can check any plan against any snapshot.

Independent of the product's rules too: which rule applies to a tier, which tiers a step is
promoted to and which keep reasons are protections are restated here from docs/retention.md and
DESIGN.md, not imported. Only the vocabulary (snapshot, policy and plan types) is shared."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from tierpoint.retention import (
    CheckpointInfo,
    ExpiryRule,
    KeepReason,
    Policy,
    RetentionPlan,
    RetentionSnapshot,
    TierCopy,
    TierRef,
    TierRule,
)
from tierpoint.states import TierState
from tierpoint.tier_config import TierKind

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# docs/retention.md, "Safety rules": a copy kept for one of these reasons stays whatever the rules
# and quotas say (DESIGN.md invariant 2: pins, leases, the last verified copy of a kept one).
PROTECTIONS = frozenset(
    {
        "pinned",
        "leased",
        "quarantined",
        "latest_durable",
        "in_flight",
        "awaiting_durable",
        "rebuild_source",
        "last_copy",
        "no_good_copy",
        # docs/retention.md, "A run's timeline": the job's newest good checkpoint, and a
        # checkpoint a job forked from it still needs.
        "newest_good",
        "fork_parent",
    }
)


def age(c: CheckpointInfo) -> tuple[bool, int, datetime, int]:
    """docs/retention.md, "A run's timeline": a superseded checkpoint counts as older than every
    checkpoint on the timeline; otherwise by step, registration time, id."""
    return (not c.superseded, c.step, c.created_at, c.id)


def rule_of(policy: Policy, tiers: Sequence[TierRef], i: int) -> TierRule | None:
    """docs/retention.md: "A tier's rules are looked up by name, then `durable` (last tier only),
    then by kind"; a peer tier `<name>.<k>` (k >= 2) without one takes `<name>`'s before
    `durable`, and "a peer tier with no rule ... keeps what the local tier it copies keeps (the
    last local tier before it)". None: the tier has no rules (it keeps everything)."""
    name, kind = tiers[i]
    if name in policy.tiers:
        return policy.tiers[name]
    base, dot, k = name.rpartition(".")
    if kind is TierKind.PEER and dot and k.isdigit() and int(k) >= 2 and base in policy.tiers:
        return policy.tiers[base]
    if i == len(tiers) - 1 and policy.durable is not None:
        return policy.durable
    if kind in policy.kinds:
        return policy.kinds[kind]
    if kind is TierKind.PEER:
        local = [j for j in range(i) if tiers[j].kind is TierKind.LOCAL]
        if local:
            return rule_of(policy, tiers, local[-1])
    return None


def keeps_everything(rule: TierRule | None) -> bool:
    """ "A tier with no rules keeps everything"; so does "a rule that sets none of `keep_last`,
    `keep_every`, `keep_within`, `keep_tags`" (`keep_last: 0` is set: it keeps none)."""
    return rule is None or (
        rule.keep_last is None
        and rule.keep_every is None
        and rule.keep_within is None
        and not rule.keep_tags
    )


def targets(policy: Policy, tiers: Sequence[TierRef], step: int) -> list[str]:
    """The tiers, in order, the checkpoint at `step` goes to: "The first tier is always a target
    (jobs write there)"; a later one when its `promote_every` (1 without a rule) divides the
    step ("`promote_every` counts steps, not registrations")."""
    out = []
    for i, (name, _) in enumerate(tiers):
        rule = rule_of(policy, tiers, i)
        every = 1 if rule is None else rule.promote_every
        if i == 0 or step % every == 0:
            out.append(name)
    return out


def is_good(c: CheckpointInfo, copy: TierCopy | None) -> bool:
    if copy is None or c.quarantined or copy.quarantined:
        return False
    return copy.state == TierState.RESTORABLE and copy.verified


def is_intact(copy: TierCopy | None) -> bool:
    """docs/retention.md, "Quarantine and retention": a copy of a checkpoint hidden by a training
    job's quarantine still holds the registered bytes; only a quarantine of the copy itself makes
    it untrustworthy."""
    if copy is None or copy.quarantined:
        return False
    return copy.state == TierState.RESTORABLE and copy.verified


def expects(c: CheckpointInfo, tier: str) -> bool:
    """The tier is still to receive the checkpoint, or has it: it did not let it go."""
    copy = c.copies.get(tier)
    return copy is None or copy.state not in (TierState.EXPIRING, TierState.EXPIRED)


def rebuilds_from(c: CheckpointInfo, tier: str) -> bool:
    """A copy of `c` is being made again from `tier`: another tier's (re-replication, repair),
    whose rebuild's hold names `tier` and which is failed and not quarantined; or the copy on
    `tier` itself, a coded copy cut again from its own stripes, whose hold names its tier."""
    return any(
        tier in copy.rebuild_from and (other == tier or being_rebuilt(copy))
        for other, copy in c.copies.items()
    )


def being_rebuilt(copy: TierCopy) -> bool:
    """docs/retention.md: a failed copy whose rebuild holds sources; quarantined, no one re-makes
    it."""
    return copy.state == TierState.FAILED and bool(copy.rebuild_from) and not copy.quarantined


def quota_of(rule: TierRule | None) -> int | None:
    return None if rule is None else rule.max_bytes


def rule_reasons(
    rule: TierRule | None, good_here: list[CheckpointInfo], c: CheckpointInfo, now: datetime
) -> set[KeepReason]:
    """The keep rules that would keep `c` on a tier whose good copies are `good_here`."""
    if rule is None or keeps_everything(rule):
        return {KeepReason.KEEP_ALL}
    others = [x for x in good_here if x.id != c.id]
    out = set()
    if rule.keep_last is not None:
        newer = [x for x in others if age(x) > age(c)]
        if len(newer) < rule.keep_last:
            out.add(KeepReason.KEEP_LAST)
    if rule.keep_every is not None:
        if rule.keep_every.steps is not None and c.step % rule.keep_every.steps == 0:
            out.add(KeepReason.KEEP_EVERY_STEPS)
        interval = rule.keep_every.interval
        if interval is not None:
            bucket = (c.created_at - EPOCH) // interval
            older_in_bucket = [
                x
                for x in others
                if (x.created_at - EPOCH) // interval == bucket
                and (x.created_at, x.step, x.id) < (c.created_at, c.step, c.id)
            ]
            if not older_in_bucket:
                out.add(KeepReason.KEEP_EVERY_INTERVAL)
    if rule.keep_within is not None and now - c.created_at <= rule.keep_within:
        out.add(KeepReason.KEEP_WITHIN)
    if set(rule.keep_tags) & c.tags:
        out.add(KeepReason.KEEP_TAGS)
    return out


def rule_keeps(
    rule: TierRule | None, good_here: list[CheckpointInfo], c: CheckpointInfo, now: datetime
) -> bool:
    return bool(rule_reasons(rule, good_here, c, now))


def check_plan(snap: RetentionSnapshot, policy: Policy, now: datetime, p: RetentionPlan) -> None:
    tiers = snap.tiers
    last = len(tiers) - 1
    names = [t.name for t in tiers]
    rules = {t.name: rule_of(policy, tiers, i) for i, t in enumerate(tiers)}
    by_id = {c.id: c for c in snap.checkpoints}
    expired = {(e.checkpoint_id, e.tier): e for e in p.expiries}
    kept = {(k.checkpoint_id, k.tier): k for k in p.keeps}
    good_on = {t: [c for c in snap.checkpoints if is_good(c, c.copies.get(t))] for t in names}

    # Every restorable copy is decided exactly once, and every failed copy on a node tier (local,
    # peer) that a lost node took part of and that no rebuild is making again; nothing else is
    # touched.
    node_tiers = {t.name for t in tiers if t.kind in (TierKind.LOCAL, TierKind.PEER)}
    decided = {
        (c.id, t)
        for c in snap.checkpoints
        for t in names
        if t in c.copies
        and (
            c.copies[t].state == TierState.RESTORABLE
            or (
                c.copies[t].state == TierState.FAILED
                and c.copies[t].on_lost_node
                and t in node_tiers
                and not being_rebuilt(c.copies[t])
            )
        )
    }
    assert set(expired) | set(kept) == decided
    assert not set(expired) & set(kept)
    assert len(expired) == len(p.expiries) and len(kept) == len(p.keeps)
    assert all(k.reasons for k in p.keeps)
    assert {(u.checkpoint_id, u.tier) for u in p.unfinished} == {
        (c.id, t)
        for c in snap.checkpoints
        for t in names
        if t in c.copies and c.copies[t].state == TierState.EXPIRING
    }

    def claims(c: CheckpointInfo, i: int) -> bool:
        """The tier has the checkpoint, or it is meant for it and has not been let go."""
        t = names[i]
        copy = c.copies.get(t)
        if is_good(c, copy):
            return True
        meant = targets(policy, tiers, c.step)
        if copy is None:
            reached = max((names.index(x) for x in c.copies if x in names), default=-1)
            return t in meant and i > reached
        return t in meant and copy.state not in (TierState.EXPIRING, TierState.EXPIRED)

    def lasting(cid: int, t: str) -> bool:
        """Not expired, and kept for more than a rebuild's hold."""
        k = kept.get((cid, t))
        return k is not None and set(k.reasons) != {KeepReason.REBUILD_SOURCE}

    durable_good = good_on[names[-1]] if names else []
    latest_durable = max(durable_good, key=age, default=None)
    good_ones = [c for c in snap.checkpoints if c.good and not c.quarantined]
    newest_good = max(good_ones, key=age, default=None)

    for (cid, tier), e in expired.items():
        c = by_id[cid]
        i = names.index(tier)
        copy = c.copies[tier]
        assert e.reason, e
        assert e.bytes == copy.bytes
        # Invariant 2: pins, leases; an operator's quarantine is evidence (docs/retention.md,
        # "Quarantine and retention": a training job's only hides the copy).
        assert not c.pinned, e
        assert not c.leased, e
        assert not (c.quarantined and c.evidence), e
        assert not (copy.quarantined and copy.evidence), e
        # The job's latest restorable checkpoint on its most durable tier.
        assert not (i == last and latest_durable is not None and cid == latest_durable.id), e
        # The job's newest good checkpoint; one a forked job still needs.
        assert not (newest_good is not None and cid == newest_good.id), e
        assert not c.child_needs, e
        # A local copy before its checkpoint is restorable on a more durable tier it is meant for.
        slower = names[i + 1 :]
        meant = targets(policy, tiers, c.step)
        if tiers[i].kind is TierKind.LOCAL and any(t in meant and expects(c, t) for t in slower):
            assert any(is_intact(c.copies.get(t)) for t in slower), e
        # No source of a copy in flight to a tier the checkpoint is meant for.
        in_flight = [t for t in slower if t in c.copies and t in meant]
        assert all(c.copies[t].state != TierState.PENDING for t in in_flight), e
        # No source of a copy that re-replication or repair is making again on another tier
        # (docs/retention.md: a hold the rebuild recorded, on a failed copy not quarantined).
        assert not rebuilds_from(c, tier), e
        # The rule named is the one that decided.
        if e.rule is ExpiryRule.NOT_KEPT:
            assert not (claims(c, i) and rule_keeps(rules[tier], good_on[tier], c, now)), e
        else:
            assert e.rule is ExpiryRule.MAX_BYTES and quota_of(rules[tier]) is not None, e

    # Last good copy of a checkpoint some tier keeps.
    for c in snap.checkpoints:
        good_tiers = [t for t in names if is_intact(c.copies.get(t))]
        keepers = [
            t
            for i, t in enumerate(names)
            if claims(c, i) and rule_keeps(rules[t], good_on[t], c, now)
        ]
        # A copy held only by a rebuild's hold stays just until the rebuild ends: it does not
        # count as the copy that remains (docs/retention.md, rebuild_source).
        remaining = [t for t in good_tiers if lasting(c.id, t)]
        if good_tiers and not remaining:
            # only a quota may take a kept checkpoint's last copy, and only from the tiers that
            # kept it
            for t in keepers:
                by = expired.get((c.id, t))
                assert by is not None and by.rule is ExpiryRule.MAX_BYTES, (c, keepers)
        if not good_tiers and keepers:
            assert not any((c.id, t) in expired for t in names), c

    # Every reason given for a keep is true, and the tier's rules are all named.
    for (cid, tier), k in kept.items():
        c = by_id[cid]
        i = names.index(tier)
        copy = c.copies[tier]
        slower = names[i + 1 :]
        meant = targets(policy, tiers, c.step)
        soft = {r for r in k.reasons if r not in PROTECTIONS}
        expected = rule_reasons(rules[tier], good_on[tier], c, now) if claims(c, i) else set()
        assert soft == expected, (k, expected)
        facts = {
            KeepReason.PINNED: c.pinned,
            KeepReason.LEASED: c.leased,
            KeepReason.QUARANTINED: (c.quarantined and c.evidence)
            or (copy.quarantined and copy.evidence),
            KeepReason.LATEST_DURABLE: i == last
            and latest_durable is not None
            and cid == latest_durable.id,
            KeepReason.IN_FLIGHT: any(
                c.copies[t].state == TierState.PENDING
                for t in slower
                if t in c.copies and t in meant
            ),
            KeepReason.AWAITING_DURABLE: tiers[i].kind is TierKind.LOCAL
            and any(t in meant and expects(c, t) for t in slower)
            and not any(is_intact(c.copies.get(t)) for t in slower),
            KeepReason.REBUILD_SOURCE: rebuilds_from(c, tier),
            KeepReason.NEWEST_GOOD: newest_good is not None and cid == newest_good.id,
            KeepReason.FORK_PARENT: c.child_needs,
        }
        for reason, fact in facts.items():
            assert (reason in k.reasons) == fact, (k, reason)
        if KeepReason.LAST_COPY in k.reasons:
            assert is_intact(copy), k
            assert not any(
                lasting(cid, t) for t in names if t != tier and is_intact(c.copies.get(t))
            ), k
        if KeepReason.NO_GOOD_COPY in k.reasons:
            assert not any(is_intact(c.copies.get(t)) for t in names), k

    # Plans list copies by tier, then oldest first.
    order = {c.id: age(c) for c in snap.checkpoints}
    for items in (p.expiries, p.keeps, p.unfinished):
        keys = [(names.index(x.tier), order[x.checkpoint_id]) for x in items]
        assert keys == sorted(keys)

    # Usage and quotas.
    for u in p.usage:
        t = u.tier
        now_bytes = sum(c.copies[t].bytes for c in snap.checkpoints if t in c.copies)
        gone = sum(e.bytes for (_, tt), e in expired.items() if tt == t)
        gone += sum(x.bytes for x in p.unfinished if x.tier == t)
        assert (u.bytes_now, u.bytes_after) == (now_bytes, now_bytes - gone)
        quota = quota_of(rules[t])
        assert u.max_bytes == quota
        if quota is None:
            assert u.quota_met is None
            assert not [e for (_, tt), e in expired.items() if tt == t and e.rule == "max_bytes"]
            continue
        assert u.quota_met == (u.bytes_after <= quota)
        assert u.over_by == max(0, u.bytes_after - quota)
        keeps_here = [k for (_, tt), k in kept.items() if tt == t]
        if not u.quota_met:
            assert all(k.protected for k in keeps_here), (t, keeps_here)
        evicted = [e for (_, tt), e in expired.items() if tt == t and e.rule == "max_bytes"]
        if evicted:
            newest = max(evicted, key=lambda e: order[e.checkpoint_id])
            assert u.bytes_after + newest.bytes > quota, "evicted more than the quota needed"
            for k in keeps_here:
                if not k.protected:
                    assert order[k.checkpoint_id] > order[newest.checkpoint_id], (k, newest)
