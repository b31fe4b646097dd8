"""Retention policy documents: what each tier keeps, and which checkpoints a tier receives at all.

A policy is a JSON document stored in `retention_policy.spec`. Its shape (format 1):

    {"format": 1,
     "tiers":   {"<tier name>": TierRule, ...},    # rules for one configured tier
     "kinds":   {"local"|"peer"|"shared"|"s3": TierRule},  # every tier of that kind
     "durable": TierRule | null}                    # the most durable tier, whatever its name

The rules for a tier are looked up in that order: by name, then `durable` (for the last tier only),
then by kind; a tier without rules keeps every checkpoint, except a peer tier. A peer tier named
`<name>.<k>` (k >= 2: copy k of a peer tier configured with `copies`, config/tiers.py: copy_name)
without a rule of its own takes the rule of `<name>` when there is one, before `durable` and the
kind; a peer tier that none of these rules keeps what the local tier it copies keeps (the last
local tier before it, `Policy.rules`): its copies are that tier's bytes held on other nodes' own
disks or RAM, and keeping all of them by omission would fill every node. Within one TierRule
the keep rules are a union: a checkpoint stays on the tier if any of them keeps it. A TierRule
that sets none of them keeps everything (so `{"max_bytes": ...}` alone is a pure quota).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Annotated, Any, Literal, NamedTuple, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeInt,
    PlainSerializer,
    PositiveInt,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from tierpoint.tier_config import NAME_RE, TierConfig, TierKind

_UNITS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION_RE = re.compile(r"^(?:\d+[wdhms])+$")
_PART_RE = re.compile(r"(\d+)([wdhms])")
_DURATION_PATTERN = r"^([0-9]+[wdhms])+$"
# The name of copy k >= 2 of a peer tier with `copies` (config/tiers.py: copy_name): `<name>.<k>`.
_COPY_RE = re.compile(r"^(.+)\.([2-9]|[1-9][0-9]+)$")


def parse_duration(value: object) -> timedelta:
    """`"7d"`, `"12h"`, `"1d12h"`, `"90m"`, `"2w"`, `"30s"` -> timedelta (whole seconds, > 0)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        text = value.strip().lower()
        if not _DURATION_RE.match(text):
            raise ValueError(
                f"{value!r} is not a duration: use a number and a unit s, m, h, d or w, "
                'e.g. "30m", "12h", "7d", "1d12h"'
            )
        seconds = sum(int(n) * _UNITS[u] for n, u in _PART_RE.findall(text))
    else:
        raise ValueError('a duration is a string such as "7d" or "12h"')
    if seconds <= 0 or seconds != int(seconds):
        raise ValueError("a duration is a positive whole number of seconds")
    return timedelta(seconds=int(seconds))


def format_duration(value: timedelta) -> str:
    """The canonical text of a duration: days, hours, minutes, seconds (`"1d12h"`)."""
    rest = int(value.total_seconds())
    parts = []
    for unit in ("d", "h", "m", "s"):
        n, rest = divmod(rest, _UNITS[unit])
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts) or "0s"


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema({"type": "string", "pattern": _DURATION_PATTERN, "examples": ["7d", "12h"]}),
]


class KeepEvery(BaseModel):
    """Keep every checkpoint whose step is a multiple of `steps`, and/or the first checkpoint of
    each `interval` (intervals are aligned to the Unix epoch in UTC, so "1d" means UTC days).

    In a policy document `"keep_every": 6` is short for `{"steps": 6}` and `"keep_every": "1d"`
    for `{"interval": "1d"}`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: PositiveInt | None = None
    interval: Duration | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, bool):
            return data  # let the model reject it with a clear type error
        if isinstance(data, int):
            return {"steps": data}
        if isinstance(data, str):
            return {"interval": data}
        return data

    @model_validator(mode="after")
    def _some(self) -> Self:
        if self.steps is None and self.interval is None:
            raise ValueError("keep_every needs `steps`, `interval`, or both")
        return self


class TierRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    keep_last: NonNegativeInt | None = Field(
        default=None, description="keep the newest N restorable checkpoints on this tier"
    )
    keep_every: KeepEvery | None = Field(
        default=None, description="keep every K-th step and/or the first checkpoint per interval"
    )
    keep_within: Duration | None = Field(
        default=None, description="keep checkpoints younger than this age (e.g. '7d')"
    )
    keep_tags: tuple[str, ...] = Field(
        default=(), description="keep checkpoints whose metadata.tags holds any of these tags"
    )
    max_bytes: NonNegativeInt | None = Field(
        default=None,
        description="quota for the job on this tier; over it, the oldest checkpoints that no "
        "safety rule protects expire first, whatever the keep rules say",
    )
    promote_every: PositiveInt = Field(
        default=1,
        description="copy a checkpoint to this tier only if its step is a multiple of N",
    )

    @field_validator("keep_tags")
    @classmethod
    def _tags(cls, tags: tuple[str, ...]) -> tuple[str, ...]:
        for tag in tags:
            if not tag or len(tag) > 128:
                raise ValueError("tags are non-empty strings of at most 128 characters")
        return tuple(sorted(set(tags)))

    def has_keep_rules(self) -> bool:
        """False when the tier keeps everything (no keep rule set)."""
        return (
            self.keep_last is not None
            or self.keep_every is not None
            or self.keep_within is not None
            or bool(self.keep_tags)
        )

    def describe(self) -> str:
        """The rule as an admin wrote it, for plan reasons: `keep_last=2, keep_every.steps=6`."""
        parts = []
        if self.keep_last is not None:
            parts.append(f"keep_last={self.keep_last}")
        if self.keep_every is not None:
            if self.keep_every.steps is not None:
                parts.append(f"keep_every.steps={self.keep_every.steps}")
            if self.keep_every.interval is not None:
                parts.append(f"keep_every.interval={format_duration(self.keep_every.interval)}")
        if self.keep_within is not None:
            parts.append(f"keep_within={format_duration(self.keep_within)}")
        if self.keep_tags:
            parts.append(f"keep_tags={list(self.keep_tags)}")
        if not parts:
            parts.append("keep everything")
        if self.max_bytes is not None:
            parts.append(f"max_bytes={self.max_bytes}")
        if self.promote_every != 1:
            parts.append(f"promote_every={self.promote_every}")
        return ", ".join(parts)


KEEP_ALL = TierRule()


class TierRef(NamedTuple):
    """A configured tier as retention sees it; tiers are ordered fastest -> most durable."""

    name: str
    kind: TierKind


def tier_refs(tiers: Iterable[TierConfig]) -> tuple[TierRef, ...]:
    """The configured tiers (Settings.tiers) as retention sees them."""
    return tuple(TierRef(t.name, t.kind) for t in tiers)


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1] = Field(default=1, description="version of the policy document format")
    tiers: dict[str, TierRule] = Field(default_factory=dict)
    kinds: dict[TierKind, TierRule] = Field(default_factory=dict)
    durable: TierRule | None = None

    @field_validator("tiers")
    @classmethod
    def _tier_names(cls, tiers: dict[str, TierRule]) -> dict[str, TierRule]:
        for name in tiers:
            if not NAME_RE.match(name):
                raise ValueError(f"{name!r} is not a tier name: [A-Za-z0-9][A-Za-z0-9._-]{{0,127}}")
        return tiers

    @field_validator("kinds")
    @classmethod
    def _local_kind(cls, kinds: dict[TierKind, TierRule]) -> dict[TierKind, TierRule]:
        local = kinds.get(TierKind.LOCAL)
        if local is not None and local.promote_every != 1:
            raise ValueError("promote_every does not apply to local tiers: jobs write there")
        return kinds

    def rule_for(self, name: str, kind: TierKind, *, most_durable: bool) -> TierRule:
        """The rule the policy itself gives the tier (KEEP_ALL: none); `rules` adds what a peer
        tier without one inherits."""
        own = self._own_rule(name, kind, most_durable=most_durable)
        return KEEP_ALL if own is None else own

    def _own_rule(self, name: str, kind: TierKind, *, most_durable: bool) -> TierRule | None:
        if name in self.tiers:
            return self.tiers[name]
        copy = _COPY_RE.match(name) if kind is TierKind.PEER else None
        if copy is not None and copy.group(1) in self.tiers:
            # Copy k of a peer tier keeps what the tier's rule says, not everything forever.
            return self.tiers[copy.group(1)]
        if most_durable and self.durable is not None:
            return self.durable
        return self.kinds.get(kind)

    def rules(self, tiers: Sequence[TierRef]) -> list[TierRule]:
        """Each configured tier's rule, in order (fastest first). A peer tier the policy gives no
        rule takes the rule of the local tier it copies (`inherited`)."""
        out: list[TierRule] = []
        copied = self.inherited(tiers)
        last = len(tiers) - 1
        names = [name for name, _ in tiers]
        for i, (name, kind) in enumerate(tiers):
            own = self._own_rule(name, kind, most_durable=i == last)
            if own is None and name in copied:
                own = out[names.index(copied[name])]
            out.append(KEEP_ALL if own is None else own)
        return out

    def inherited(self, tiers: Sequence[TierRef]) -> dict[str, str]:
        """Peer tier -> the local tier whose rule it keeps, for each peer tier the policy gives no
        rule of its own: the last local tier before it, the one its copies are made from."""
        out: dict[str, str] = {}
        last = len(tiers) - 1
        local: str | None = None
        for i, (name, kind) in enumerate(tiers):
            if kind is TierKind.LOCAL:
                local = name
            elif (
                kind is TierKind.PEER
                and local is not None
                and self._own_rule(name, kind, most_durable=i == last) is None
            ):
                out[name] = local
        return out

    def to_spec(self) -> dict[str, Any]:
        """The compact canonical JSON document stored in retention_policy.spec."""
        return {"format": self.format, **self.model_dump(mode="json", exclude_defaults=True)}

    @classmethod
    def from_spec(cls, spec: object) -> Policy:
        """Parse a stored or submitted document; pydantic.ValidationError names the bad field."""
        return cls.model_validate(spec)


class PolicyProblem(BaseModel):
    """A policy that is valid on its own but does not fit the configured tiers."""

    loc: tuple[str, ...]
    msg: str


def check_tiers(policy: Policy, tiers: Sequence[TierRef]) -> list[PolicyProblem]:
    """Problems of `policy` against the configured tiers (ordered fastest -> most durable):
    rules for tiers that do not exist, and promote_every on the first tier (jobs write there, so
    it cannot apply). The API should refuse such a policy with 422 (code `unknown_tier` for the
    first kind)."""
    names = [name for name, _ in tiers]
    problems = [
        PolicyProblem(loc=("tiers", name), msg=f"no tier named {name!r} is configured")
        for name in sorted(policy.tiers)
        if name not in names
    ]
    if tiers:
        first = tiers[0].name
        rule = policy.rules(tiers)[0]
        if rule.promote_every != 1:
            problems.append(
                PolicyProblem(
                    loc=("tiers", first, "promote_every"),
                    msg=f"{first!r} is the first tier: every checkpoint is written there",
                )
            )
    return problems


def promotion_targets(policy: Policy, tiers: Sequence[TierRef], step: int) -> list[str]:
    """The tiers, in order, on which the checkpoint at `step` should become restorable.

    The first tier is always included (the job writes there). A later tier is included when its
    rule's `promote_every` divides the step: "every Nth" means by step multiple, so the decision
    depends on the checkpoint alone, never on what else was registered, in which order, or what was
    deleted since. With checkpoints every K steps, promote_every=N*K sends every Nth checkpoint.
    """
    targets = []
    for i, ((name, _), rule) in enumerate(zip(tiers, policy.rules(tiers), strict=True)):
        if i == 0 or step % rule.promote_every == 0:
            targets.append(name)
    return targets


DEFAULT_POLICY = Policy(
    kinds={
        TierKind.LOCAL: TierRule(keep_last=2),
        TierKind.PEER: TierRule(keep_last=2),
        TierKind.SHARED: TierRule(keep_last=4),
    },
    durable=KEEP_ALL,
)
"""Used for jobs without a policy when the catalog has no default policy row: the most durable tier
keeps everything; local and peer tiers keep the newest 2 (a peer copy is there to restore a lost
node's local copy, so it keeps what the local tier keeps: docs/retention.md) and shared tiers the
newest 4 (unless the shared tier is the most durable one). Pins, tags and leases need no rule to
be safe."""
