"""Reclaim policies: per offer, per priority class and a default, validated field by field.

A policy says when an idle lease is taken back (timeouts, the notice ahead, extensions, grace
after work, a maximum age), how (``stop``, ``shrink:<offer>``, ``release-gpu``) and who is spared.
Fields merge downwards (offer over priority class over default); errors name the field as
``reclaim.<level>.<field>``, as the pool config's other errors do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from .catalog import Catalog, GpuModel, default_catalog
from .errors import ConfigError
from .model import PRIORITY_CLASSES, Offer, offer_units


@dataclass(frozen=True)
class ReclaimPolicy:
    """When an idle lease is taken back, how, and who is spared. Durations are seconds."""

    enabled: bool = True
    #: 30 min, not the culler's 1 h: the culler's hour is a margin for what HTTP activity cannot
    #: see (a silent training cell); here a window counts as idle only when the GPU, the kernel
    #: and the user are all idle, a notice comes first and the documents are saved.
    idle_timeout: float = 1800.0
    pressure_idle_timeout: float = 1200.0
    cpu_busy_timeout: float = 4 * 3600.0
    warn_before: float = 600.0
    max_extensions: int = 2
    extension: float = 3600.0
    max_age: float | None = None
    busy_grace: float = 900.0
    min_runtime: float = 1800.0
    gpu_idle_threshold: float = 5.0
    action: str = "stop"
    exempt_users: frozenset[str] = frozenset()
    exempt_groups: frozenset[str] = frozenset()
    reclaim_busy_borrowed: bool = False

    @property
    def shrink_to(self) -> str | None:
        """The target offer of a ``shrink:<offer>`` action."""
        return self.action.partition(":")[2] if self.action.startswith("shrink:") else None

    def exempts(self, user: str, groups: Iterable[str]) -> str | None:
        """Why this user is spared (``None``: not exempt)."""
        if user in self.exempt_users:
            return f"user {user} is exempt"
        hit = sorted(self.exempt_groups & set(groups))
        return f"group {hit[0]} is exempt" if hit else None


#: The policy fields that are durations (seconds, or text such as ``15m``).
DURATION_FIELDS = (
    "idle_timeout",
    "pressure_idle_timeout",
    "cpu_busy_timeout",
    "warn_before",
    "extension",
    "max_age",
    "busy_grace",
    "min_runtime",
)
POLICY_FIELDS = tuple(f for f in ReclaimPolicy.__dataclass_fields__)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_RE = re.compile(r"^(?:(\d+(?:\.\d+)?)([smhd]))+$")


def parse_duration(value: object, field_name: str) -> float:
    """Seconds from a number or a string such as ``90s``, ``15m``, ``1h30m``, ``2d``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(
            f"must be a duration (seconds, or like 30m), got {value!r}", field=field_name
        )
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        if not _DURATION_RE.match(text):
            raise ConfigError(
                f"must be a duration like 90s, 15m or 1h30m, got {value!r}", field=field_name
            )
        seconds = sum(float(n) * _UNIT[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)([smhd])", text))
    else:
        seconds = float(value)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ConfigError(f"must be finite, got {value!r}", field=field_name)
    if seconds < 0:
        raise ConfigError(f"must not be negative, got {value!r}", field=field_name)
    return seconds


SHRINK_KINDS = {"gpu": ("gpu", "mig", "shared"), "mig": ("mig",), "shared": ("shared",)}
_NOMINAL = GpuModel("any", 80.0)


def shrink_problem(source: Offer, target: Offer, catalog: Catalog | None = None) -> str | None:
    """Why ``source`` cannot shrink into ``target`` (``None``: it can): the target must be a
    GPU offer of a compatible kind, on a model both can use, costing fewer units on it."""
    if target.kind not in SHRINK_KINDS.get(source.kind, ()):
        return (
            f"offer {source.name!r} ({source.kind}) cannot shrink into {target.name!r} "
            f"({target.kind}); use release-gpu for a server without a GPU"
            if target.kind == "cpu"
            else f"offer {source.name!r} ({source.kind}) cannot shrink into a {target.kind} offer"
        )
    catalog = catalog or default_catalog()
    if source.models and target.models:
        names = [m for m in source.models if m in target.models]
    else:
        names = list(source.models or target.models)
    models = [catalog.model(n) for n in names] if names else [_NOMINAL]
    if target.kind == "mig":
        models = [m for m in models if target.profile in m.profiles]
    if not models:
        return f"no GPU model serves both {source.name!r} and {target.name!r}"
    for m in models:
        if offer_units(target, m) >= offer_units(source, m):
            return (
                f"{target.name!r} costs {float(offer_units(target, m)):g} units on {m.name}, "
                f"not fewer than {source.name!r} ({float(offer_units(source, m)):g})"
            )
    return None


def parse_policy(
    raw: object,
    offers: Mapping[str, Offer],
    where: str = "reclaim.default",
    *,
    base: ReclaimPolicy | None = None,
    offer: Offer | None = None,
    catalog: Catalog | None = None,
) -> ReclaimPolicy:
    """Validate one policy mapping over ``base`` (fields not given are inherited); errors name
    the field as ``<where>.<field>``. With ``offer``, a shrink target is checked against it."""
    if not isinstance(raw, Mapping):
        raise ConfigError("a reclaim policy must be a mapping", field=where)
    unknown = set(raw) - set(POLICY_FIELDS)
    if unknown:
        raise ConfigError(
            f"unknown field(s) {', '.join(sorted(map(str, unknown)))}",
            field=where,
            allowed=POLICY_FIELDS,
        )
    values: dict[str, object] = {}
    for key, value in raw.items():
        name = f"{where}.{key}"
        if key in DURATION_FIELDS:
            values[key] = (
                None if key == "max_age" and value is None else parse_duration(value, name)
            )
        elif key in ("enabled", "reclaim_busy_borrowed"):
            if not isinstance(value, bool):
                raise ConfigError(f"must be true or false, got {value!r}", field=name)
            values[key] = value
        elif key == "max_extensions":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"must be a whole number >= 0, got {value!r}", field=name)
            values[key] = value
        elif key == "gpu_idle_threshold":
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value < 100
            ):
                raise ConfigError(f"must be a percentage in [0, 100), got {value!r}", field=name)
            values[key] = float(value)
        elif key in ("exempt_users", "exempt_groups"):
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise ConfigError("must be a list of names", field=name)
            values[key] = frozenset(value)
        elif key == "action":
            values[key] = _parse_action(value, offers, name, offer, catalog)
    # each value was checked against its field's type above
    policy = replace(base or ReclaimPolicy(), **values)  # type: ignore[arg-type]  # see above
    _check_consistent(policy, where)
    return policy


def _parse_action(
    value: object,
    offers: Mapping[str, Offer],
    name: str,
    offer: Offer | None,
    catalog: Catalog | None,
) -> str:
    if value in ("stop", "release-gpu"):
        return str(value)
    if not isinstance(value, str) or not value.startswith("shrink:"):
        raise ConfigError(
            f"unknown action {value!r}",
            field=name,
            allowed=("stop", "release-gpu", "shrink:<offer>"),
        )
    target = offers.get(value.partition(":")[2])
    if target is None:
        raise ConfigError(f"unknown shrink target {value!r}", field=name, allowed=sorted(offers))
    if target.kind == "cpu":
        raise ConfigError(f"{target.name!r} has no GPU: use release-gpu", field=name)
    if offer is not None:
        problem = shrink_problem(offer, target, catalog)
        if problem:
            raise ConfigError(problem, field=name)
    return value


def _check_consistent(p: ReclaimPolicy, where: str) -> None:
    for key in ("idle_timeout", "pressure_idle_timeout", "cpu_busy_timeout"):
        if getattr(p, key) <= 0:
            raise ConfigError("must be longer than 0", field=f"{where}.{key}")
    if p.pressure_idle_timeout > p.idle_timeout:
        raise ConfigError(
            f"({p.pressure_idle_timeout:g} s) must not exceed idle_timeout ({p.idle_timeout:g} s)",
            field=f"{where}.pressure_idle_timeout",
        )
    if p.cpu_busy_timeout < p.idle_timeout:
        raise ConfigError(
            f"({p.cpu_busy_timeout:g} s) must be at least idle_timeout ({p.idle_timeout:g} s)",
            field=f"{where}.cpu_busy_timeout",
        )
    if p.warn_before > p.pressure_idle_timeout:
        raise ConfigError(
            f"({p.warn_before:g} s) is longer than the timeout it warns of "
            f"(pressure_idle_timeout {p.pressure_idle_timeout:g} s)",
            field=f"{where}.warn_before",
        )
    if p.max_age is not None and p.max_age <= p.warn_before:
        raise ConfigError(
            f"({p.max_age:g} s) must be longer than warn_before ({p.warn_before:g} s)",
            field=f"{where}.max_age",
        )
    if p.max_extensions and p.extension <= 0:
        raise ConfigError(
            "must be longer than 0 when extensions are allowed", field=f"{where}.extension"
        )


@dataclass(frozen=True)
class PolicySet:
    """The default policy, one per priority class and one per offer (each already merged over
    the level below it)."""

    default: ReclaimPolicy = field(default_factory=ReclaimPolicy)
    classes: Mapping[str, ReclaimPolicy] = field(default_factory=dict)
    offers: Mapping[str, ReclaimPolicy] = field(default_factory=dict)

    def for_offer(self, offer: Offer | str | None) -> ReclaimPolicy:
        """Resolution order: the offer's policy, then its priority class's, then the default."""
        if offer is None:
            return self.default
        if isinstance(offer, str):
            return self.offers.get(offer, self.default)
        found = self.offers.get(offer.name) or self.classes.get(offer.priority_class)
        return found or self.default


def parse_policies(
    raw: Mapping[str, object] | None,
    offers: Mapping[str, Offer],
    where: str = "reclaim",
    catalog: Catalog | None = None,
) -> PolicySet:
    """The ``reclaim`` section: ``default``, ``priority_classes: {class: policy}`` and
    ``offers: {offer: policy}``. Fields merge downwards; every offer's resolved shrink target is
    checked against that offer, so a default of ``shrink:x`` needs ``x`` its own action."""
    raw = raw or {}
    if not isinstance(raw, Mapping):
        raise ConfigError("must be a mapping", field=where)
    allowed = ("default", "priority_classes", "offers")
    unknown = set(raw) - set(allowed)
    if unknown:
        raise ConfigError(
            f"unknown field(s) {', '.join(sorted(unknown))}", field=where, allowed=allowed
        )
    default = parse_policy(raw.get("default") or {}, offers, f"{where}.default", catalog=catalog)
    classes: dict[str, ReclaimPolicy] = {}
    known = sorted(set(PRIORITY_CLASSES) | {o.priority_class for o in offers.values()})
    for name, body in _mapping(raw.get("priority_classes"), f"{where}.priority_classes").items():
        if name not in known:
            raise ConfigError(
                f"unknown priority class {name!r}", field=f"{where}.priority_classes", allowed=known
            )
        classes[name] = parse_policy(
            body, offers, f"{where}.priority_classes.{name}", base=default, catalog=catalog
        )
    by_offer: dict[str, ReclaimPolicy] = {}
    for name, body in _mapping(raw.get("offers"), f"{where}.offers").items():
        if name not in offers:
            raise ConfigError(
                f"unknown offer {name!r}", field=f"{where}.offers", allowed=sorted(offers)
            )
        o = offers[name]
        base = classes.get(o.priority_class, default)
        by_offer[name] = parse_policy(
            body, offers, f"{where}.offers.{name}", base=base, offer=o, catalog=catalog
        )
    policies = PolicySet(default, classes, by_offer)
    for o in offers.values():
        target = policies.for_offer(o).shrink_to
        if target and o.kind != "cpu":
            problem = shrink_problem(o, offers[target], catalog)
            if problem:
                level = (
                    "offers." + o.name
                    if o.name in by_offer
                    else (
                        f"priority_classes.{o.priority_class}"
                        if o.priority_class in classes
                        else "default"
                    )
                )
                raise ConfigError(problem, field=f"{where}.{level}.action")
    return policies


def _mapping(value: object, where: str) -> Mapping[str, object]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError("must be a mapping", field=where)
    return value
