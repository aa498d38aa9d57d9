"""Chargeback prices and the one rounding rule every cost figure follows.

A price is per GPU unit-hour held, per GPU model; a model may also have a lower price for the
hours its GPU was busy (an incentive to use what one holds). Costs are ``Decimal``: a lease's
cost is exact (its unit-hours are taken to six decimals, as the usage report shows them), a
report row's cost is the exact sum of its leases' costs rounded once to the cent (half up), and
a total is the sum of the rounded rows. So the rows of a CSV add up to the API's total, to the
cent, whatever tool adds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from .errors import ConfigError, UnknownModel
from .limits import MAX_PRICE

#: The columns of a usage row (the API's JSON, its CSV and the monthly report), after the key.
USAGE_COLUMNS = (
    "leases",
    "held_unit_hours",
    "busy_unit_hours",
    "idle_unit_hours",
    "idle_share",
    "unpriced_unit_hours",
    "cost",
)
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


@dataclass(frozen=True)
class Prices:
    """The ``prices:`` section: a currency and a price per model (unpriced models cost 0)."""

    currency: str = "USD"
    models: Mapping[str, ModelPrice] = field(default_factory=dict)

    def cost(self, model: str | None, held: Decimal, busy: Decimal) -> Decimal | None:
        """The exact cost of ``held`` unit-hours of which ``busy`` were busy; None: unpriced."""
        price = self.models.get(model or "")
        if price is None:
            return None
        busy = min(busy, held)
        return (held - busy) * price.held + busy * price.busy

    def to_json(self) -> dict[str, object]:
        """The section as the API shows it (prices as strings: exact)."""
        return {
            "currency": self.currency,
            "models": {
                m: {"held": str(p.held), "busy": str(p.busy)}
                for m, p in sorted(self.models.items())
            },
        }


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
    if price.as_tuple().exponent < -6:  # type: ignore[operator]
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
    prices: dict[str, ModelPrice] = {}
    for model, spec in section.items():
        where = f"{path}.models.{model}"
        if model not in models:
            raise UnknownModel(f"unknown GPU model {model!r}", field=where, allowed=models)
        if isinstance(spec, Mapping):
            extra = set(spec) - {"held", "busy"}
            if extra or "held" not in spec:
                raise ConfigError(
                    "a price is a number or {held, busy}", field=where, allowed=["held", "busy"]
                )
            held = _price(spec["held"], f"{where}.held")
            busy = _price(spec.get("busy", spec["held"]), f"{where}.busy")
            if busy > held:
                raise ConfigError(
                    f"the busy-hour price ({busy}) may not exceed the held price ({held})",
                    field=f"{where}.busy",
                )
        else:
            held = busy = _price(spec, where)
        prices[str(model)] = ModelPrice(held, busy)
    return Prices(currency.upper(), prices)
