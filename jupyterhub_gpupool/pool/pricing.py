"""Chargeback prices and the one rounding rule every cost figure follows.

A price is per GPU unit-hour held, per GPU model; a model may also have a lower price for the
hours its GPU was busy (an incentive to use what one holds). Costs are ``Decimal``: a lease's
cost is exact (its unit-hours are taken to six decimals, as the usage report shows them), a
report row's cost is the exact sum of its leases' costs rounded once to the cent (half up), and
a total is the sum of the rounded rows. So the rows of a CSV add up to the API's total, to the
cent, whatever tool adds them.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from ..timeparse import parse_time
from .errors import ConfigError, UnknownModel
from .limits import MAX_PRICE

#: The columns of a usage row (the API's JSON, its CSV and the monthly report), after the key.
USAGE_COLUMNS = (
    "leases",
    "held_unit_hours",
    "busy_unit_hours",
    "estimated_busy_unit_hours",
    "idle_unit_hours",
    "idle_share",
    "unpriced_unit_hours",
    "cost",
)
#: The effective start of a price in force from the beginning.
ALWAYS = datetime(1970, 1, 1)
CENT = Decimal("0.01")
#: Unit-hours enter costs at the precision the usage report shows them.
HOURS = Decimal("0.000001")


def to_hours(value: float) -> Decimal:
    """A float of unit-hours as the report shows it (six decimals)."""
    return Decimal(repr(round(value, 6))).quantize(HOURS, rounding=ROUND_HALF_UP)


def cents(value: Decimal) -> Decimal:
    """The rounding rule: to the cent, half up."""
    return value.quantize(CENT, rounding=ROUND_HALF_UP)


@dataclass(frozen=True)
class ModelPrice:
    """What one unit-hour of this model costs held, and (lower or equal) busy."""

    held: Decimal
    busy: Decimal


#: A model's prices over time: (effective start, price; None: unpriced from then), by start.
Schedule = tuple[tuple[datetime, ModelPrice | None], ...]


@dataclass(frozen=True)
class Prices:
    """The ``prices:`` section, or the prices recorded over time: a currency and, per model, the
    prices with their effective starts (``schedule``). ``models`` is each model's newest price.
    Unpriced models cost 0 (their hours are reported as unpriced)."""

    currency: str = "USD"
    models: Mapping[str, ModelPrice] = field(default_factory=dict)
    schedule: Mapping[str, Schedule] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.models and not self.schedule:  # one price per model, in force always
            object.__setattr__(
                self, "schedule", {m: ((ALWAYS, p),) for m, p in self.models.items()}
            )
        elif self.schedule and not self.models:
            newest = {m: s[-1][1] for m, s in self.schedule.items() if s and s[-1][1]}
            object.__setattr__(self, "models", newest)

    def cost(self, model: str | None, held: Decimal, busy: Decimal) -> Decimal | None:
        """The exact cost at the newest price of ``held`` unit-hours of which ``busy`` were
        busy; None: unpriced."""
        price = self.models.get(model or "")
        if price is None:
            return None
        busy = min(busy, held)
        return (held - busy) * price.held + busy * price.busy

    def price_at(self, model: str | None, hour: datetime) -> tuple[datetime, ModelPrice] | None:
        """The price of ``model`` in force at ``hour`` with when it took effect (None:
        unpriced then)."""
        schedule = self.schedule.get(model or "", ())
        i = bisect_right([start for start, _ in schedule], hour)
        if i == 0:
            return None
        start, price = schedule[i - 1]
        return None if price is None else (start, price)

    def to_json(self) -> dict[str, object]:
        """The price table over time as the API shows it (prices as strings: exact; ``from``
        null: since always; ``held`` null: unpriced from then)."""
        return {
            "currency": self.currency,
            "models": {
                m: [
                    {
                        "from": None if start == ALWAYS else start.isoformat() + "Z",
                        "held": None if p is None else str(p.held),
                        "busy": None if p is None else str(p.busy),
                    }
                    for start, p in sched
                ]
                for m, sched in sorted(self.schedule.items())
            },
        }


def next_hour(t: datetime) -> datetime:
    """The first whole hour at or after ``t``: when a price change made at ``t`` takes effect."""
    h = t.replace(minute=0, second=0, microsecond=0)
    return h if h == t else h + timedelta(hours=1)


def reconcile(
    recorded: Mapping[str, Schedule], config: Prices, now: datetime
) -> tuple[dict[str, Schedule], list[str]]:
    """The price schedules to record when the pool config is loaded at ``now``.

    What was in force before the next whole hour (``next_hour(now)``) is kept as recorded: a
    past hour is never repriced. From that hour on, the config's schedule applies: the price it
    has in force then (if it differs from the recorded one) and its later entries. With nothing
    recorded yet (a first start, or an upgrade from before price history) the config's whole
    schedule is recorded, so past months read as they did. Returns the schedules and, for the
    log, each config entry that would have changed the past and was not applied.
    """
    if not recorded:
        return {m: tuple(sched) for m, sched in config.schedule.items()}, []
    cut = next_hour(now)
    out: dict[str, Schedule] = {}
    ignored: list[str] = []
    for model in sorted(set(recorded) | set(config.schedule)):
        past = [(t, p) for t, p in recorded.get(model, ()) if t < cut]
        wanted = config.schedule.get(model, ())
        for t, p in wanted:
            if ALWAYS < t < cut and _in_force(past, t) != p:
                ignored.append(f"{model} from {'always' if t == ALWAYS else t.isoformat()}")
        now_price = _in_force(list(wanted), cut)
        future = [(t, p) for t, p in wanted if t > cut]
        if _in_force(past, cut) != now_price:
            past.append((cut, now_price))
        sched = past + future
        if any(p is not None for _, p in sched):
            out[model] = tuple(sched)
    return out, ignored


def _in_force(
    schedule: list[tuple[datetime, ModelPrice | None]] | Schedule, t: datetime
) -> ModelPrice | None:
    price: ModelPrice | None = None
    for start, p in schedule:
        if start <= t:
            price = p
    return price


def _price(value: object, field: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"must be a price (a number ≥ 0), got {value!r}", field=field)
    try:
        price = Decimal(str(value))
    except InvalidOperation:
        raise ConfigError(f"must be a price (a number ≥ 0), got {value!r}", field=field) from None
    if not price.is_finite() or price < 0:
        raise ConfigError(f"must be a price (a number ≥ 0), got {value!r}", field=field)
    if price > MAX_PRICE:
        raise ConfigError(f"must be at most {MAX_PRICE:,} per unit-hour", field=field)
    if price.as_tuple().exponent < -6:  # type: ignore[operator]  # finite: an int exponent
        raise ConfigError("at most six decimals", field=field)
    return price


def parse_prices(raw: object, models: list[str], path: str = "prices") -> Prices:
    """Validate ``prices: {currency, models: {MODEL: PRICE | {held, busy}}}``.

    ``models`` are the catalog's model names: a price for any other model is refused naming its
    field, with the known models allowed (a typo would otherwise bill nothing, silently).
    """
    if raw is None:
        return Prices()
    if not isinstance(raw, Mapping):
        raise ConfigError("must be a mapping (currency, models)", field=path)
    unknown = set(raw) - {"currency", "models"}
    if unknown:
        raise ConfigError(
            f"unknown field(s) {', '.join(sorted(map(str, unknown)))}",
            field=path,
            allowed=["currency", "models"],
        )
    currency = raw.get("currency", "USD")
    if not isinstance(currency, str) or not (3 <= len(currency) <= 8) or not currency.isalpha():
        raise ConfigError(
            f"must be a currency code such as EUR or USD, got {currency!r}",
            field=f"{path}.currency",
        )
    section = raw.get("models", {}) or {}
    if not isinstance(section, Mapping):
        raise ConfigError("must be a mapping of GPU model → price", field=f"{path}.models")
    schedule: dict[str, Schedule] = {}
    for model, spec in section.items():
        where = f"{path}.models.{model}"
        if model not in models:
            raise UnknownModel(f"unknown GPU model {model!r}", field=where, allowed=models)
        if isinstance(spec, list):
            schedule[str(model)] = _schedule(spec, where)
        else:
            schedule[str(model)] = ((ALWAYS, _model_price(spec, where, ("held", "busy"))),)
    return Prices(currency.upper(), schedule=schedule)


def _model_price(spec: object, where: str, keys: tuple[str, ...]) -> ModelPrice:
    """A number (held = busy) or ``{held, busy}`` (busy defaults to held)."""
    if isinstance(spec, Mapping):
        extra = set(spec) - set(keys)
        if extra or "held" not in spec:
            raise ConfigError(
                "a price is a number or {held, busy}", field=where, allowed=list(keys)
            )
        held = _price(spec["held"], f"{where}.held")
        busy = _price(spec.get("busy", spec["held"]), f"{where}.busy")
        if busy > held:
            raise ConfigError(
                f"the busy-hour price ({busy}) may not exceed the held price ({held})",
                field=f"{where}.busy",
            )
        return ModelPrice(held, busy)
    held = _price(spec, where)
    return ModelPrice(held, held)


def _schedule(entries: list[object], where: str) -> Schedule:
    """A list of ``{from, held, busy}``: the first may omit ``from`` (in force since always);
    every ``from`` is a whole hour (UTC), each later than the one before."""
    if not entries:
        raise ConfigError("a price history needs at least one entry", field=where)
    out: list[tuple[datetime, ModelPrice | None]] = []
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(
                "must be {from, held, busy}", field=at, allowed=["from", "held", "busy"]
            )
        if "from" not in entry and i > 0:
            raise ConfigError("every entry but the first needs 'from'", field=f"{at}.from")
        start = ALWAYS if "from" not in entry else effective_start(entry["from"], f"{at}.from")
        if out and start <= out[-1][0]:
            raise ConfigError("must be later than the entry before", field=f"{at}.from")
        price = {k: v for k, v in entry.items() if k != "from"}
        out.append((start, _model_price(price, at, ("held", "busy"))))
    return tuple(out)


def effective_start(value: object, field: str) -> datetime:
    """A price's effective start: an ISO 8601 time (or date) on a whole hour, as naive UTC."""
    if isinstance(value, datetime):
        t = value
    elif isinstance(value, date):
        t = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        try:
            moment = parse_time(value)
        except ValueError:
            moment = None
        if moment is None:
            raise ConfigError(
                f"must be an ISO 8601 time such as 2026-11-15T00:00:00Z, got {value!r}", field=field
            )
        t = moment
    else:
        raise ConfigError(f"must be an ISO 8601 time, got {value!r}", field=field)
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc).replace(tzinfo=None)
    if (t.minute, t.second, t.microsecond) != (0, 0, 0):
        raise ConfigError("a price takes effect on a whole hour (UTC)", field=field)
    return t
