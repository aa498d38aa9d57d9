"""A reference model of the bill: random months (leases of every offer kind, groups, samples on
every device, prices) run through the store and the service's sample path, then checked against
an independent computation written from the chargeback docs' definitions
(``docs/source/howto/chargeback.md``, "Definitions"). The reference below uses exact fractions
and none of the project's accounting code (``pool.usage``, ``pool.pricing``, ``store``'s)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.service.ingest import ingest
from jupyterhub_gpupool.service.utilization import Sample, UtilizationBuffer
from tests.fakes import BILL_POOL, StoreClock, make_instances, make_store

POOL = BILL_POOL
NOV, DEC = datetime(2026, 11, 1), datetime(2026, 12, 1)
#: The docs' units: a whole GPU is 1; a MIG slice its dominant share of the A100-80GB (1g.10gb:
#: 1 of 7 compute slices, 1 of 8 memory slices → 1/7; 3g.40gb: 3/7 and 4/8 → 1/2).
UNITS = {"h100": Fraction(1), "h100x2": Fraction(2), "a100-1g": Fraction(1, 7),
         "a100-3g": Fraction(1, 2)}  # fmt: skip
MODEL = {"h100": "H100-80GB", "h100x2": "H100-80GB", "a100-1g": "A100-80GB",
         "a100-3g": "A100-80GB"}  # fmt: skip
BASES = (datetime(2026, 10, 31, 21, 0), datetime(2026, 11, 15, 12, 0), datetime(2026, 11, 30, 20))
BY = ("user", "group", "offer")
EPOCH = datetime(1970, 1, 1)


def sec(t: datetime) -> int:
    return int((t - EPOCH).total_seconds())


# -- the strategies: a month ----------------------------------------------------------------

price = st.decimals(min_value=Decimal("0.01"), max_value=Decimal("9.99"), places=2)
#: The hour of November a price changes: mostly where the drawn leases run (near the bases).
change_hour = st.one_of(st.integers(0, 8), st.integers(348, 356), st.integers(714, 719))
model_prices = st.one_of(
    # a price, then another from an hour of the month on
    st.tuples(price, st.integers(0, 100), change_hour, price, st.integers(0, 100)),
    st.tuples(price, st.integers(0, 100)),  # one price (busy: a percentage of held)
    st.none(),  # unpriced
)
prices = st.fixed_dictionaries({"H100-80GB": model_prices, "A100-80GB": model_prices})
lease = st.fixed_dictionaries(
    {
        "user": st.sampled_from(["ann", "bob", "cem", "dan"]),
        "group": st.sampled_from([None, "ml", "cv"]),
        "offer": st.sampled_from(sorted(UNITS)),
        "base": st.sampled_from(BASES),
        "start": st.integers(0, 400),  # minutes after its base
        "minutes": st.integers(1, 300),
        # seconds to each sample after the previous one, and each device's activity then
        "samples": st.lists(
            st.tuples(st.integers(1, 200), st.booleans(), st.booleans()), max_size=25
        ),
    }
)


def price_section(raw: dict) -> dict:
    """The pool config's ``prices:`` for the drawn prices."""
    models: dict = {}
    for model, spec in raw.items():
        if spec is None:
            continue
        first = {"held": str(spec[0]), "busy": str(busy_of(spec[0], spec[1]))}
        if len(spec) == 2:
            models[model] = first
        else:
            start = NOV + timedelta(hours=spec[2])
            models[model] = [first, {"from": start.isoformat() + "Z", "held": str(spec[3]),
                                     "busy": str(busy_of(spec[3], spec[4]))}]  # fmt: skip
    return {"currency": "EUR", "models": models}


def busy_of(held: Decimal, pct: int) -> Decimal:
    return (held * pct / 100).quantize(Decimal("0.01"))


def schedule(raw: dict, model: str) -> list[tuple[int, dict | None]]:
    """(first second, {held, busy}) of each price of ``model``, by start; none: unpriced."""
    spec = raw.get(model)
    if spec is None:
        return [(0, None)]
    out = [(0, {"held": spec[0], "busy": busy_of(spec[0], spec[1])})]
    if len(spec) == 5:
        later = {"held": spec[3], "busy": busy_of(spec[3], spec[4])}
        out.append((sec(NOV + timedelta(hours=spec[2])), later))
    return out


# -- the reference: the docs' definitions, computed exactly ----------------------------------------


@dataclass
class Ref:
    """One granted lease as the reference sees it."""

    user: str
    group: str | None
    offer: str
    devices: list[tuple[str, int | None]]
    granted: int
    released: int
    busy: dict[int, Fraction] = field(default_factory=dict)  # hour index → busy seconds
    estimated: dict[int, Fraction] = field(default_factory=dict)


def six(x: Fraction) -> Decimal:
    """To six decimals, half up."""
    return (
        (Decimal(x.numerator) / Decimal(x.denominator)).quantize(
            Decimal("0.000001"), rounding=ROUND_HALF_UP
        )
        if x
        else Decimal("0.000000")
    )


def add_busy(ref: Ref, end: int, seconds: int, estimated: bool) -> None:
    """Busy seconds (÷ devices) placed in the hours of [end - seconds, end)."""
    share = Fraction(1, len(ref.devices))
    t = end - seconds
    while t < end:
        h = t // 3600
        part = min(end, (h + 1) * 3600) - t
        ref.busy[h] = ref.busy.get(h, Fraction(0)) + part * share
        if estimated:
            ref.estimated[h] = ref.estimated.get(h, Fraction(0)) + part * share
        t += part


def line(ref: Ref, start: int, end: int, prices: list[tuple[int, dict | None]]) -> dict:
    """The docs' line item of a lease within [start, end): per price in force, its held and busy
    unit-hours (six decimals each); the cost of all of them rounded once to the cent."""
    units = UNITS[ref.offer]
    lo, hi = max(ref.granted, start), min(ref.released, end)
    parts: dict[int, list[Fraction]] = {}  # price index → [held s, busy s, estimated s]
    for h in range(lo // 3600, (hi - 1) // 3600 + 1) if hi > lo else ():
        in_range = min(hi, (h + 1) * 3600) - max(lo, h * 3600)
        in_hour = min(ref.released, (h + 1) * 3600) - max(ref.granted, h * 3600)
        b = min(ref.busy.get(h, Fraction(0)), in_hour)
        e = min(ref.estimated.get(h, Fraction(0)), b)
        share = Fraction(in_range, in_hour)
        k = max(i for i, (t, _) in enumerate(prices) if t <= h * 3600)
        acc = parts.setdefault(k, [Fraction(0)] * 3)
        acc[0] += in_range
        acc[1] += b * share
        acc[2] += e * share
    total = {k: Decimal(0) for k in ("held", "busy", "estimated", "unpriced")}
    exact = Decimal(0)
    for k, (held_s, busy_s, est_s) in parts.items():
        held = six(held_s * units / 3600)
        busy = min(held, six(busy_s * units / 3600))
        est = min(busy, six(est_s * units / 3600))
        total["held"] += held
        total["busy"] += busy
        total["estimated"] += est
        price = prices[k][1]
        if price is None:
            total["unpriced"] += held
        else:
            exact += (held - busy) * price["held"] + busy * price["busy"]
    return total | {"cost": exact.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)}


def reference_rows(refs: list[Ref], by: str, raw: dict) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for ref in refs:
        item = line(ref, sec(NOV), sec(DEC), schedule(raw, MODEL[ref.offer]))
        if not (ref.granted < sec(DEC) and ref.released > sec(NOV)):
            continue  # held nothing in the month
        key = getattr(ref, by) or "(no group)"
        r = rows.setdefault(key, {"leases": 0} | {k: Decimal(0) for k in item})
        r["leases"] += 1
        for k, v in item.items():
            r[k] += v
    return rows


# -- the run: the store and the service's sample path ------------------------------------------


def run_month(month: list[dict], section: dict, url: str) -> tuple[object, list[Ref]]:
    clock = StoreClock(datetime(2026, 10, 31, 20, 0))
    store = make_store(url, clock, pool={**POOL, "prices": section})
    buffer = UtilizationBuffer(window=86400)
    events = []  # (second, order, index, payload): releases, then grants, then samples
    for i, spec in enumerate(month):
        t0 = sec(spec["base"]) + spec["start"] * 60
        t1 = t0 + spec["minutes"] * 60
        events += [(t0, 1, i, None), (t1, 0, i, None)]
        t = t0
        for gap, a, b in spec["samples"]:
            t += gap
            if t < t1:
                events.append((t, 2, i, (a, b)))
    refs: dict[int, Ref] = {}
    ids: dict[int, str] = {}
    last: dict[tuple[str, int | None], int] = {}
    for t, kind, i, payload in sorted(events, key=lambda e: e[:3]):
        clock.now = EPOCH + timedelta(seconds=t)
        spec = month[i]
        if kind == 1:
            groups = (spec["group"],) if spec["group"] else ()
            got = store.allocate(spec["user"], f"s{i}", spec["offer"], group=spec["group"],
                                 groups=groups)  # fmt: skip
            if got.state != "granted":
                store.release(got.id)  # no room: withdrawn, it held nothing
                continue
            if spec["offer"].startswith("a100"):
                make_instances(store)
            store.keepalive(got.id)
            ids[i] = got.id
            devices = [(s.gpu, s.start) for s in got.slots]
            t1 = t + spec["minutes"] * 60
            refs[i] = Ref(spec["user"], spec["group"], spec["offer"], devices, t, t1)
        elif kind == 0:
            if i in ids:
                store.release(ids[i])
        elif i in refs:
            ref = refs[i]
            mig = spec["offer"].startswith("a100")
            batch = []
            for (gpu, start), busy in zip(ref.devices, payload, strict=False):
                if mig:  # no utilization on A100 slices: processes and memory
                    batch.append(Sample(float(t), gpu, start, None, 3000 if busy else 0,
                                        1 if busy else 0))  # fmt: skip
                else:
                    batch.append(Sample(float(t), gpu, start, 70.0 if busy else 0.0, 0))
                prev = last.get((gpu, start))
                last[(gpu, start)] = t
                if busy and prev is not None:  # the docs: since the device's previous sample,
                    add_busy(ref, t, min(t - prev, 60), estimated=mig)  # at most a minute
            store.add_busy(ingest(store, buffer, batch, 5.0))
    clock.now = datetime(2026, 12, 3)
    return store, list(refs.values())


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(month=st.lists(lease, min_size=1, max_size=8), raw_prices=prices)
def test_the_services_bill_equals_the_reference_computed_from_the_docs(month, raw_prices):
    section = price_section(raw_prices)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'pool.sqlite'}"
        upgrade(url)
        store, refs = run_month(month, section, url)
        totals = set()
        for by in BY:
            body = store.usage_report(NOV, DEC, by)  # type: ignore[attr-defined]
            expected = reference_rows(refs, by, raw_prices)
            got = {i.key: i.figures for i in body.items}
            assert sorted(got) == sorted(expected)
            for key, want in expected.items():
                have = got[key]
                assert have.leases == want["leases"], key
                assert have.held == want["held"], key
                assert have.busy == want["busy"], key
                assert have.estimated == want["estimated"], key
                assert have.unpriced == want["unpriced"], key
                assert have.cost == want["cost"], key
            want_cost = sum((r["cost"] for r in expected.values()), Decimal(0))
            assert body.total.cost == want_cost
            totals.add((body.total.cost, body.total.held))
        assert len(totals) == 1  # every grouping, the same total


def test_the_reference_itself_on_a_hand_example():
    """The reference's own arithmetic, on numbers worked by hand: a 1g.10gb slice held 90 min,
    busy (estimated) 40 min, at 3 held / 2 busy: 0.214286 held, 0.095238 busy, 0.55."""
    ref = Ref("ann", None, "a100-1g", [("g", 0)], sec(NOV), sec(NOV) + 5400)
    add_busy(ref, sec(NOV) + 2400, 2400, estimated=True)
    item = line(ref, sec(NOV), sec(DEC), [(0, {"held": Decimal(3), "busy": Decimal(2)})])
    assert item["held"] == Decimal("0.214286") and item["busy"] == Decimal("0.095238")
    assert item["cost"] == Decimal("0.55")  # 0.119048 × 3 + 0.095238 × 2 = 0.547620
