"""Quotas in GPU units: guarantees, hard limits, borrowing and unit-hour budgets.

A *guarantee* is capacity always available to a user or group; a *limit* is a hard cap that may
exceed the guarantee by *borrowing* idle capacity. A lease granted beyond its owner's guarantee
(and beyond its group's) is borrowed: the pool may reclaim it for somebody within guarantee.
Budgets cap unit-hours per period. An optional *exception ceiling* lets a request beyond the limit
be asked for with a reason: an administrator approves it, and that request alone is then held to
the ceiling instead of the limit until its exception lapses. Units are exact fractions so that
7 × 1/7 is exactly 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from fractions import Fraction

from .errors import ConfigError
from .limits import MAX_BUDGET, MAX_UNITS, shown

#: Nothing held (one value: ``Fraction`` is immutable, and a new one per tally read costs
#: more than the read).
_ZERO = Fraction(0)

PERIODS = ("day", "week", "month")


def period_start(now: datetime, period: str) -> datetime:
    """Start of the budget period containing ``now``: a day, an ISO week (from Monday) or a
    calendar month. Budgets reset at these instants, so ``now`` must be in UTC for every pool
    process to agree on them; any period but day and week counts as a month."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)


#: Reasons a request is refused or held back by quota (machine-readable, part of the API).
QUOTA_CODES = (
    "no_quota",  # the limit is zero: this user/group may not use GPUs at all
    "exceeds_limit",  # larger than the limit even with nothing else held: never grantable
    "over_limit",  # over the limit now; grantable once the owner releases something
    "budget_exhausted",  # the unit-hour budget of this period is spent
    "not_in_group",  # the request names a group the user is not in
)


def _units(value: object, field_name: str, maximum: int = MAX_UNITS) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Fraction)):
        raise ConfigError(f"must be a number of GPU units, got {value!r}", field=field_name)
    try:
        units = Fraction(value).limit_denominator(10_000)
    except (ValueError, ZeroDivisionError, OverflowError):
        raise ConfigError(
            f"must be a number of GPU units, got {value!r}", field=field_name
        ) from None
    if units < 0:
        raise ConfigError(f"must not be negative, got {shown(value)}", field=field_name)
    if units > maximum:
        raise ConfigError(f"must be at most {maximum:,}, got {shown(value)}", field=field_name)
    return units


#: What a spent budget does (``refuse`` by default).
BUDGET_ACTIONS = ("refuse", "notify", "stop")
#: Every field of a quota, in the order the API and the forms show them.
QUOTA_FIELDS = (
    "guarantee",
    "limit",
    "budget",
    "period",
    "exception",
    "budget_action",
    "budget_minimum",
)


@dataclass(frozen=True)
class QuotaSpec:
    """One user's or group's quota. ``limit=None`` means no cap beyond the pool's size."""

    guarantee: Fraction = Fraction(0)
    limit: Fraction | None = None
    budget: Fraction | None = None
    period: str = "month"
    #: The most an approved exception request may take the holder to (None: no exceptions).
    exception: Fraction | None = None
    #: What a spent budget does: ``refuse`` new grants (running leases go on), ``notify`` only
    #: (warnings, nothing refused), or ``stop`` (refuse, and reclaim running leases).
    budget_action: str = "refuse"
    #: A grant never starts with less than this many unit-hours of budget left.
    budget_minimum: Fraction = Fraction(0)

    def budget_level(self, used: float) -> int | None:
        """The warning level ``used`` unit-hours reach: 100 (spent), 80, or None (below 80 %,
        or no budget)."""
        if self.budget is None:
            return None
        if used >= float(self.budget):
            return 100
        return 80 if used >= 0.8 * float(self.budget) else None

    def budget_refuses(self, used: float) -> bool:
        """Whether a spent (or nearly spent) budget refuses a new grant now: with a budget and
        an action other than ``notify``, when what is left is nothing or under the minimum."""
        if self.budget is None or self.budget_action == "notify":
            return False
        left = float(self.budget) - used
        return left <= 0 or left < float(self.budget_minimum)

    def cap(self, exception: bool = False) -> Fraction | None:
        """The limit a request is held to: the exception ceiling for an approved exception."""
        return self.exception if exception and self.exception is not None else self.limit

    @classmethod
    def parse(cls, raw: Mapping[str, object], where: str = "quota") -> QuotaSpec:
        """Validate a quota mapping (``guarantee``, ``limit``, ``budget``, ``period``,
        ``exception``)."""
        if not isinstance(raw, Mapping):
            raise ConfigError("must be a mapping", field=where)
        allowed = set(QUOTA_FIELDS)
        unknown = set(raw) - allowed
        if unknown:
            raise ConfigError(
                f"unknown field(s) {', '.join(sorted(unknown))}",
                field=where,
                allowed=sorted(allowed),
            )
        guarantee = _units(raw.get("guarantee", 0), f"{where}.guarantee")
        limit = raw.get("limit")
        limit_u = None if limit is None else _units(limit, f"{where}.limit")
        budget = raw.get("budget")
        budget_u = None if budget is None else _units(budget, f"{where}.budget", MAX_BUDGET)
        period = raw.get("period", "month")
        if period not in PERIODS:
            raise ConfigError(
                f"unknown period {period!r}", field=f"{where}.period", allowed=PERIODS
            )
        if limit_u is not None and guarantee > limit_u:
            raise ConfigError(
                f"guarantee ({float(guarantee):g}) is above limit ({float(limit_u):g})",
                field=f"{where}.guarantee",
            )
        ceiling = raw.get("exception")
        ceiling_u = None if ceiling is None else _units(ceiling, f"{where}.exception")
        if ceiling_u is not None and (limit_u is None or ceiling_u <= limit_u):
            raise ConfigError(
                "an exception ceiling must be above a limit"
                + ("" if limit_u is None else f" ({float(limit_u):g})"),
                field=f"{where}.exception",
            )
        action = raw.get("budget_action", "refuse")
        if action not in BUDGET_ACTIONS:
            raise ConfigError(
                f"unknown budget action {action!r}",
                field=f"{where}.budget_action",
                allowed=list(BUDGET_ACTIONS),
            )
        minimum = _units(raw.get("budget_minimum", 0) or 0, f"{where}.budget_minimum", MAX_BUDGET)
        if budget_u is not None and minimum > budget_u:
            raise ConfigError(
                f"the minimum ({float(minimum):g}) is above the budget ({float(budget_u):g})",
                field=f"{where}.budget_minimum",
            )
        return cls(guarantee, limit_u, budget_u, str(period), ceiling_u, str(action), minimum)

    def to_dict(self) -> dict[str, object]:
        """JSON-friendly form (floats)."""
        return {
            "guarantee": float(self.guarantee),
            "limit": None if self.limit is None else float(self.limit),
            "budget": None if self.budget is None else float(self.budget),
            "period": self.period,
            "exception": None if self.exception is None else float(self.exception),
            "budget_action": self.budget_action,
            "budget_minimum": float(self.budget_minimum),
        }


@dataclass(frozen=True)
class QuotaInEffect:
    """A user's or group's quota in effect and where it comes from: what ``GET quotas/...``
    reads, a quota edit answers, and ``PatchQuota`` edits the fields of (so its rule reads a
    typed value, not the API's JSON)."""

    name: str
    #: ``user`` or ``group``.
    kind: str
    #: ``api`` (an admin's override), ``file`` (the pool config), ``default`` (a user without
    #: a quota of their own) or ``none`` (no quota: the spec's defaults).
    source: str
    spec: QuotaSpec


@dataclass(frozen=True)
class Verdict:
    """The quota answer for one request."""

    ok: bool
    group: str | None = None
    borrowed: bool = False
    code: str | None = None
    message: str = ""

    @property
    def can_wait(self) -> bool:
        """Whether queueing can ever turn this into a grant."""
        return self.ok or self.code == "over_limit"


@dataclass
class QuotaBook:
    """Quota specs plus what everybody holds now and has used this period."""

    users: dict[str, QuotaSpec] = field(default_factory=dict)
    groups: dict[str, QuotaSpec] = field(default_factory=dict)
    default_user: QuotaSpec = field(default_factory=QuotaSpec)
    held_user: dict[str, Fraction] = field(default_factory=dict)
    held_group: dict[str, Fraction] = field(default_factory=dict)
    used_hours: dict[str, float] = field(default_factory=dict)

    def user_spec(self, user: str) -> QuotaSpec:
        """The user's own quota, else the default for everybody."""
        return self.users.get(user, self.default_user)

    def held(self, user: str) -> Fraction:
        """Units the user holds now."""
        return self.held_user.get(user, _ZERO)

    def group_held(self, group: str) -> Fraction:
        """Units the group holds now."""
        return self.held_group.get(group, _ZERO)

    def share(self, group: str | None, user: str) -> float:
        """Weighted share for fair ordering: held / guarantee (of the group, else the user)."""
        if group is not None and group in self.groups:
            held, spec = self.group_held(group), self.groups[group]
        else:
            held, spec = self.held(user), self.user_spec(user)
        if spec.guarantee:
            return float(held / spec.guarantee)
        return float(held) * 1e6 if held else 0.0

    def check(
        self,
        user: str,
        groups: Iterable[str],
        units: Fraction,
        requested_group: str | None = None,
        exception: bool = False,
    ) -> Verdict:
        """May ``user`` take ``units`` more now? Picks the group charged and whether it borrows.

        ``exception``: an approved exception request, held to the exception ceilings (where a
        quota has one) instead of the limits."""
        groups = list(groups)
        spec = self.user_spec(user)
        limit = spec.cap(exception)
        if requested_group is not None and requested_group not in groups:
            return Verdict(
                False,
                code="not_in_group",
                message=f"{user} is not a member of group {requested_group!r}",
            )
        if spec.budget_refuses(self.used_hours.get(user, 0.0)):
            return Verdict(
                False,
                code="budget_exhausted",
                message=f"{user} has used the {float(spec.budget or 0):g} unit-hour budget "
                f"of this {spec.period}",
            )
        if limit is not None:
            if limit == 0:
                return Verdict(False, code="no_quota", message=f"{user} has no GPU quota")
            if units > limit:
                return Verdict(
                    False,
                    code="exceeds_limit",
                    message=f"{float(units):g} units exceed {user}'s limit of {float(limit):g}",
                )
        candidates = (
            [requested_group] if requested_group else [g for g in groups if g in self.groups]
        )
        chosen: str | None = None
        waiting: Verdict | None = None
        for g in candidates:
            gspec = self.groups.get(g)
            if gspec is None:
                chosen = g
                break
            if gspec.budget_refuses(self.used_hours.get(f"group:{g}", 0.0)):
                waiting = waiting or Verdict(
                    False,
                    code="budget_exhausted",
                    message=f"group {g} has used its unit-hour budget",
                )
                continue
            glimit = gspec.cap(exception)
            if glimit is not None and glimit == 0:
                waiting = waiting or Verdict(
                    False, code="no_quota", message=f"group {g} has no GPU quota"
                )
                continue
            if glimit is not None and units > glimit:
                waiting = waiting or Verdict(
                    False,
                    code="exceeds_limit",
                    message=f"{float(units):g} units exceed group {g}'s limit of {float(glimit):g}",
                )
                continue
            if glimit is not None and self.group_held(g) + units > glimit:
                if waiting is not None and waiting.code != "over_limit":
                    waiting = None  # a group that is merely full beats one that never fits
                waiting = waiting or Verdict(
                    False,
                    group=g,
                    code="over_limit",
                    message=f"group {g} is at its limit of {float(glimit):g} units",
                )
                continue
            chosen = g
            break
        else:
            if candidates:
                assert waiting is not None
                return waiting
        if limit is not None and self.held(user) + units > limit:
            return Verdict(
                False,
                group=chosen,
                code="over_limit",
                message=f"{user} holds {float(self.held(user)):g} of a {float(limit):g}-unit limit",
            )
        return Verdict(True, group=chosen, borrowed=self.borrows(user, chosen, units))

    def exception_ceiling(
        self, user: str, groups: Iterable[str], requested_group: str | None = None
    ) -> Fraction | None:
        """The highest exception ceiling open to ``user`` (their own quota's or a group's it
        could be charged to), or None when no quota of theirs allows exceptions."""
        specs = [self.user_spec(user)]
        names = [requested_group] if requested_group else list(groups)
        specs += [self.groups[g] for g in names if g in self.groups]
        ceilings = [s.exception for s in specs if s.exception is not None]
        return max(ceilings) if ceilings else None

    def borrows(self, user: str, group: str | None, units: Fraction) -> bool:
        """True when ``units`` more would go beyond both the user's and the group's guarantee."""
        if self.held(user) + units <= self.user_spec(user).guarantee:
            return False
        if group is not None and group in self.groups:
            return self.group_held(group) + units > self.groups[group].guarantee
        return True

    def add(self, user: str, group: str | None, units: Fraction) -> None:
        """Record a grant."""
        self.held_user[user] = self.held(user) + units
        if group is not None:
            self.held_group[group] = self.group_held(group) + units

    def remove(self, user: str, group: str | None, units: Fraction) -> None:
        """Record a release; never goes below zero."""
        self.held_user[user] = max(_ZERO, self.held(user) - units)
        if group is not None:
            self.held_group[group] = max(_ZERO, self.group_held(group) - units)
