"""The admin panel's governance pages in real Chromium: usage and cost, capacity, what-if.

A real hub (under the base URL ``/jh/``) and the pool service run on a database in which a
week of requests was recorded through the store, on a clock the test moves (the days before
today, so the service's own clock only reads history). Every day at 09:00 three users ask for
the one H100; each holds it for an hour, half of it busy: the recorded waits are 0, 60 and
120 min (p95 120); with one more H100 they would have been 0, 0 and 60. Users and groups with
hostile names hold the A100 idle for 17 minutes now and then (so costs need rounding).

An admin opens each page and sees the API's figures for the same range; the CSV download adds
up to the API's total to the cent; the what-if form with ``+1`` H100 shows the shorter wait
(the API's answer) and a bad input shows the API's refusal beside its field; a non-admin is
refused every new page and its API calls; hostile names are text. With
``GPUPOOL_SCREENSHOTS=DIR`` each page is saved there (the docs show them).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import yaml

pytest.importorskip("playwright.sync_api")

from playwright.sync_api import Page, expect

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool.usage import busy_from
from jupyterhub_gpupool.service.pages.base import shown as display
from tests.fakes import HubEnv, StoreClock, make_store, request, write_pool

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="no Chromium"),
]

BASE = "/jh/"
#: Names no page may render as markup or evaluate as a template.
SCRIPT = "<script>window.pwned=1</script>"
IMG = '"><img src=x onerror="window.pwned=1">'
TEMPLATE = "{{7*7}}"
RTL = "\u202eevil\u202c-rtl"
HOSTILE = (SCRIPT, IMG, TEMPLATE, RTL)
PAGES = ("admin/usage", "admin/capacity", "admin/what-if")
POOL: dict[str, Any] = {
    "nodes": [
        {"name": "h100", "cpu_milli": 64000, "memory_mib": 262144,
         "gpus": [{"model": "H100-80GB", "count": 1}]},
        {"name": "a100", "cpu_milli": 64000, "memory_mib": 262144,
         "gpus": [{"model": "A100-80GB", "count": 1}]},
    ],
    "offers": [
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "a100", "kind": "gpu", "models": ["A100-80GB"], "display_name": IMG + " A100"},
    ],
    "quotas": {"default": {"guarantee": 1, "limit": 1}},
    "prices": {"currency": "EUR",
               "models": {"H100-80GB": 3.10, "A100-80GB": {"held": 2.40, "busy": 1.90}}},
}  # fmt: skip
DAYS = 7


def record_week(url: str, day0: datetime) -> None:
    """Seven days of requests, recorded through the store on a clock the test moves."""
    upgrade(url)
    clock = StoreClock(day0)
    store = make_store(url, clock, pool=POOL)
    for d in range(DAYS):
        clock.now = day0 + timedelta(days=d, hours=9)
        leases = [store.allocate(user, "", "h100", group="ml", groups=("ml",)) for user in
                  ("ann", "bob", "cem")]  # fmt: skip
        assert [x.state for x in leases] == ["granted", "queued", "queued"]
        for _ in leases:  # whoever is granted holds it an hour, half busy, and stops
            [lease] = [x for x in leases if store.lease(x.id).state == "granted"]
            store.keepalive(lease.id)
            store.add_busy(busy_from(lease.id, store.clock(), 0.5))
            clock.advance(hours=1)
            store.release(lease.id)
        if d % 3 == 0:  # hostile names hold the A100 idle, one after another
            clock.now = day0 + timedelta(days=d, hours=14)
            for name in HOSTILE:
                lease = store.allocate(name, "", "a100", group=name, groups=(name,))
                store.keepalive(lease.id)
                clock.advance(minutes=17)
                store.release(lease.id)
    store.engine.dispose()


@pytest.fixture(scope="module")
def today() -> datetime:
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    return datetime(now.year, now.month, now.day)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, today: datetime) -> Iterator[HubEnv]:
    tmp = tmp_path_factory.mktemp("governance")
    url = f"sqlite:///{tmp}/pool.sqlite"
    record_week(url, today - timedelta(days=DAYS + 1))
    env = HubEnv(
        tmp,
        url,
        write_pool(tmp, yaml.safe_dump(POOL)),
        users=("alice", "admin"),
        base_url=BASE,
        service_args=(
            "--PoolService.reconcile_on_start=False",
            "--PoolService.reconcile_interval=0",
            "--PoolService.check_user_servers=False",
        ),
    )
    with env.running():
        yield env


@pytest.fixture
def admin(hub: HubEnv, hub_login: Any) -> Page:
    return hub_login(hub, "admin")


def prefix(hub: HubEnv) -> str:
    return f"{hub.hub_url}{hub.service_prefix}"


def api(hub: HubEnv, path: str, body: object = None, method: str = "GET") -> Any:
    r = request(method, f"{hub.api}/{path}", hub.token("admin"), body)
    assert r.status == 200, r.body
    return r.json()


def no_markup_ran(page: Page) -> None:
    assert page.evaluate("window.pwned") is None
    assert page.locator("main img").count() == 0


def cells(page: Page, selector: str) -> list[list[str]]:
    return page.eval_on_selector_all(
        f"{selector} tbody tr",
        "rows => rows.map(r => [...r.children].map(c => c.textContent.trim()))",
    )


def hours(x: float) -> str:
    """Unit-hours as the panel shows them: as the API has them, six decimals at most."""
    return f"{x:.6f}".rstrip("0").rstrip(".")


def week(today: datetime) -> dict[str, str]:
    return {
        "from": (today - timedelta(days=DAYS + 1)).date().isoformat(),
        "to": today.date().isoformat(),
    }


def test_usage_page_shows_the_apis_figures_and_the_csv_adds_up_to_the_cent(
    hub: HubEnv, admin: Page, today: datetime, shoot: Any
) -> None:
    # the default range is the current month of the service's clock
    admin.goto(prefix(hub) + "admin/usage")
    first = today.replace(day=1).date().isoformat()
    assert admin.input_value('#usage-filters [name="from"]') == first
    # the seeded week, per user, chosen in the form
    rng = week(today)
    admin.fill('#usage-filters [name="from"]', rng["from"])
    admin.fill('#usage-filters [name="to"]', rng["to"])
    admin.select_option('#usage-filters [name="by"]', "user")
    admin.click('#usage-filters button[type="submit"]')
    admin.wait_for_url("**by=user**")
    body = api(hub, f"usage?by=user&{urlencode(rng)}")
    shown = cells(admin, "#usage")
    # names as every page shows them: bidirectional controls as visible [U+202E]
    assert [r[0] for r in shown] == [display(i["user"]) for i in body["items"]]
    assert [r[8] for r in shown] == [i["cost"] for i in body["items"]]
    assert [r[2] for r in shown] == [hours(i["held_unit_hours"]) for i in body["items"]]
    assert [r[3] for r in shown] == [hours(i["busy_unit_hours"]) for i in body["items"]]
    total = admin.locator("#usage-total td.cost").inner_text()
    assert total == body["total"]["cost"] and Decimal(total) > 0
    for name in HOSTILE:  # hostile users as text, each one row
        assert [r[0] for r in shown].count(display(name)) == 1
    no_markup_ran(admin)
    # the charts are drawn (Chart.js on canvas)
    assert admin.evaluate("!!Chart.getChart(document.getElementById('usage-hours'))")
    assert admin.evaluate(
        "Chart.getChart(document.getElementById('usage-cost')).data.labels.length"
    ) == len(body["items"])
    # the CSV download: the API's CSV (fetched with the XSRF token), to the cent the JSON's
    with admin.expect_download() as info:
        admin.click("#usage-csv")
    download = info.value
    assert download.suggested_filename == "gpu-usage-by-user.csv"
    rows = list(csv.DictReader(io.StringIO(Path(download.path()).read_text())))
    assert [r["user"] for r in rows] == [i["user"] for i in body["items"]]
    assert sum((Decimal(r["cost"]) for r in rows), Decimal(0)) == Decimal(body["total"]["cost"])
    # the top idle holders: the API's, in its order
    idle = api(hub, f"usage/idle-holders?limit=10&{urlencode(rng)}")
    listed = cells(admin, "#idle-holders")
    assert [r[0] for r in listed] == [display(h["user"]) for h in idle["items"]]
    assert [r[6] for r in listed] == [h["idle_cost"] for h in idle["items"]]
    assert {r[0] for r in listed} >= set(map(display, HOSTILE))
    # per group: the hostile group names are text too
    admin.select_option('#usage-filters [name="by"]', "group")
    admin.click('#usage-filters button[type="submit"]')
    admin.wait_for_url("**by=group**")
    groups = api(hub, f"usage?by=group&{urlencode(rng)}")
    shown = cells(admin, "#usage")
    assert [r[0] for r in shown] == [display(i["group"]) for i in groups["items"]]
    assert set(map(display, HOSTILE)) | {"ml"} == {r[0] for r in shown}
    assert admin.locator("#usage-total td.cost").inner_text() == groups["total"]["cost"]
    no_markup_ran(admin)
    shoot(admin, "admin-usage", full=True)
    # a time that is none: said, naming the field (the default range is shown instead)
    admin.goto(prefix(hub) + "admin/usage?from=soon")
    expect(admin.locator("#usage-error")).to_contain_text("from: from must be an ISO 8601 time")
    assert admin.input_value('#usage-filters [name="from"]') == first
    # a range that ends before it starts: the store's refusal, naming the field
    admin.goto(prefix(hub) + f"admin/usage?from={rng['to']}&to={rng['from']}")
    expect(admin.locator("#usage-error")).to_contain_text("to: 'to' must be after 'from'")


def test_capacity_page_shows_demand_waits_and_idle_per_offer_and_day(
    hub: HubEnv, admin: Page, today: datetime, shoot: Any
) -> None:
    rng = week(today)
    admin.goto(prefix(hub) + "admin/capacity?" + urlencode(rng))
    body = api(hub, f"capacity?{urlencode(rng)}")
    shown = cells(admin, "#capacity")
    assert len(shown) == len(body["items"]) > DAYS
    by_key = {(r["offer"], r["day"]): r for r in body["items"]}
    rows = admin.eval_on_selector_all(
        "#capacity tbody tr",
        """rows => rows.map(r => [r.dataset.offer, r.dataset.day,
            ...[...r.children].slice(2).map(c => c.textContent.trim())])""",
    )
    for (
        offer,
        day,
        requests,
        demand,
        held,
        _busy,
        _waited,
        idle,
        p50,
        p95,
        quota,
        cap,
        *refused,
    ) in rows:
        want = by_key[(offer, day)]
        assert int(requests) == want["requests"]
        assert demand == f"{want['demand_unit_hours']:.2f}"
        assert held == f"{want['held_unit_hours']:.2f}"
        assert idle == f"{want['idle_share'] * 100:.0f} %"
        for shown_wait, key in ((p50, "wait_p50_min"), (p95, "wait_p95_min")):
            assert shown_wait == ("–" if want[key] is None else str(want[key]))
        assert (int(quota), int(cap)) == (want["queued_for_quota"], want["queued_for_capacity"])
        assert [int(n) for n in refused] == [want["refused_by_quota"], want["refused_by_capacity"]]
    # the H100's days are as constructed: waits 0, 60, 120 min; two waited for capacity
    h100 = [r for r in body["items"] if r["offer"] == "h100"]
    assert len(h100) == DAYS
    waits = {(r["wait_p50_min"], r["wait_p95_min"], r["queued_for_capacity"]) for r in h100}
    assert waits == {(60.0, 120.0, 2)}
    # the hostile offer's display name is text
    assert IMG + " A100" in admin.locator("#capacity").inner_text()
    no_markup_ran(admin)
    for chart in ("capacity-demand", "capacity-waits", "capacity-idle", "capacity-queued"):
        assert admin.evaluate(f"!!Chart.getChart(document.getElementById('{chart}'))"), chart
    shoot(admin, "admin-capacity", full=True)
    # one offer only
    admin.select_option('#capacity-filters [name="offer"]', "h100")
    admin.click('#capacity-filters button[type="submit"]')
    admin.wait_for_url("**offer=h100**")
    assert {r[0] for r in cells(admin, "#capacity")} == {"h100"}
    # more than the API answers at a time: its refusal, naming the field
    admin.goto(prefix(hub) + "admin/capacity?from=2020-01-01&to=2026-01-01")
    expect(admin.locator("#capacity-error")).to_contain_text("from: at most 366 days at a time")


def minutes(text: str) -> float | None:
    """A wait as a page shows it (``–``: none)."""
    return None if text == "–" else float(text)


def replay_rows(page: Page) -> dict[str, dict[str, str]]:
    rows = page.eval_on_selector_all(
        "#whatif-table tbody tr",
        """rows => rows.map(r => [r.dataset.offer,
            Object.fromEntries([...r.children].slice(1).map((c, i) => [
                ["requests", "p50_then", "p50_now", "p95_then", "p95_now", "unserved_then",
                 "unserved_now", "held_then", "held_now", "idle_then", "idle_now"][i],
                c.textContent.trim()]))])""",
    )
    return dict(rows)


def test_what_if_with_one_more_h100_shows_the_shorter_wait(
    hub: HubEnv, admin: Page, shoot: Any
) -> None:
    admin.goto(prefix(hub) + "admin/what-if")
    form = admin.locator("#whatif-form")
    form.locator('[name="days"]').fill("7")
    form.locator('[name="add-model"]').fill("H100-80GB")
    form.locator('[name="add-count"]').fill("1")
    admin.click("#whatif-run")
    expect(admin.locator("#whatif-result")).to_be_visible()
    expect(admin.locator("#whatif-title")).to_contain_text("+1 H100-80GB")
    shown = replay_rows(admin)
    answer = api(hub, "capacity/what-if", {"days": 7, "add": {"H100-80GB": 1}}, "POST")
    h100 = answer["offers"]["h100"]
    assert (h100["recorded"]["wait_p95_min"], h100["what_if"]["wait_p95_min"]) == (120.0, 60.0)
    for offer, pair in answer["offers"].items():
        row = shown[offer]
        for side, key in (("recorded", "then"), ("what_if", "now")):
            assert minutes(row[f"p50_{key}"]) == pair[side]["wait_p50_min"]
            assert minutes(row[f"p95_{key}"]) == pair[side]["wait_p95_min"]
            assert row[f"unserved_{key}"] == str(pair[side]["unserved"])
            assert row[f"idle_{key}"] == f"{round(pair[side]['idle_share'] * 100)} %"
    assert admin.evaluate("!!Chart.getChart(document.getElementById('whatif-waits'))")
    no_markup_ran(admin)
    shoot(admin, "admin-whatif", full=True)
    # two models, one row each: both added (the API's description says so)
    admin.click("#whatif-add-row")
    form.locator('[name="add-model"]').nth(1).fill("A100-80GB")
    admin.click("#whatif-run")
    expect(admin.locator("#whatif-title")).to_contain_text("+1 H100-80GB, +1 A100-80GB")
    # a node taken out: the H100's requests are never served
    form.locator('[name="add-model"]').nth(0).fill("")
    form.locator('[name="add-model"]').nth(1).fill("")
    form.locator('input[name="remove"][value="h100"]').check()
    admin.click("#whatif-run")
    expect(admin.locator("#whatif-title")).to_contain_text("-node h100")
    expect(admin.locator('#whatif-table tr[data-offer="h100"] td.unserved.changed')).to_have_text(
        str(answer["offers"]["h100"]["recorded"]["requests"])
    )


def test_bad_what_if_input_shows_the_apis_error_beside_its_field(hub: HubEnv, admin: Page) -> None:
    admin.goto(prefix(hub) + "admin/what-if")
    form = admin.locator("#whatif-form")
    form.locator('[name="days"]').fill("7")
    form.locator('[name="add-model"]').fill("A100-90GB")
    admin.click("#whatif-run")
    expect(admin.locator("#whatif-error-add")).to_contain_text("add: unknown GPU model 'A100-90GB'")
    assert admin.get_attribute("#whatif-add", "aria-invalid") == "true"
    expect(admin.locator("#whatif-result")).to_be_hidden()
    # more days than recorded: the API says how many there are, beside the days
    form.locator('[name="add-model"]').fill("H100-80GB")
    form.locator('[name="days"]').fill("30")
    admin.click("#whatif-run")
    expect(admin.locator("#whatif-error-days")).to_contain_text(f"holds {DAYS + 1} days")
    expect(admin.locator("#whatif-error-add")).to_be_hidden()
    assert form.locator('[name="days"]').get_attribute("aria-invalid") == "true"
    form.locator('[name="days"]').fill("0")
    admin.click("#whatif-run")
    expect(admin.locator("#whatif-error-days")).to_contain_text("days must be from 1 to 366")
    # a reclaim policy the API refuses names its field
    form.locator('[name="days"]').fill("7")
    form.locator('[name="reclaim"]').fill('{"default": {"idle_timeout": "soon"}}')
    admin.click("#whatif-run")
    expect(admin.locator("#whatif-error-reclaim")).to_contain_text("reclaim.default.idle_timeout")
    form.locator('[name="reclaim"]').fill("")
    form.locator('[name="mig_layout"]').fill("nowhere=1g.10gb")
    admin.click("#whatif-run")
    expect(admin.locator("#whatif-error-mig_layout")).to_contain_text("no node 'nowhere'")


def test_a_non_admin_is_refused_every_governance_page_and_call(hub: HubEnv, hub_login: Any) -> None:
    alice = hub_login(hub, "alice")
    for path in PAGES:
        r = alice.goto(prefix(hub) + path)
        assert r is not None and r.status == 403, path
        expect(alice.locator("#gpupool-error")).to_contain_text("custom:gpupool:admin")
    r = alice.goto(prefix(hub))  # her own page: the script's API address and XSRF token
    assert r is not None and r.status == 200, (r and r.status, alice.content()[:2000])
    expect(alice.locator('meta[name="gpupool-api"]')).to_have_count(1)
    calls = [
        ("GET", "usage?format=csv", None),
        ("GET", "usage/idle-holders", None),
        ("GET", "capacity", None),
        ("POST", "capacity/what-if", {"days": 1, "add": {"H100-80GB": 1}}),
    ]
    statuses = alice.evaluate(
        """async (calls) => {
            const api = document.querySelector('meta[name="gpupool-api"]').content;
            const xsrf = document.querySelector('meta[name="gpupool-xsrf"]').content;
            const out = [];
            for (const [method, path, body] of calls) {
                const r = await fetch(api + path, {method, credentials: "same-origin",
                    headers: {"X-XSRFToken": xsrf, "Content-Type": "application/json"},
                    body: body === null ? undefined : JSON.stringify(body)});
                out.push([r.status, (await r.json()).error?.code]);
            }
            return out;
        }""",
        calls,
    )
    assert statuses == [[403, "forbidden"]] * len(calls)


def test_the_pages_send_a_strict_csp_and_stay_under_the_base_url(hub: HubEnv, admin: Page) -> None:
    for path in PAGES:
        r = admin.goto(prefix(hub) + path)
        assert r is not None and r.status == 200
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        for attr in admin.eval_on_selector_all(
            "script[src], link[href]",
            "els => els.map(e => e.getAttribute('src') || e.getAttribute('href'))",
        ):
            assert attr.startswith(f"{BASE}services/gpupool/static/"), attr
        current = admin.locator('nav[aria-label="Admin panel"] a[aria-current="page"]')
        assert current.get_attribute("href") == f"{BASE}services/gpupool/{path}"


AXE = Path(__file__).resolve().parents[2] / ".node" / "node_modules" / "axe-core" / "axe.min.js"


def test_the_pages_have_no_wcag_violations(hub: HubEnv, admin: Page, today: datetime) -> None:
    """axe-core (WCAG 2 A/AA, contrast included) on each page with its figures (the what-if
    page after a replay). axe is evaluated over the DevTools protocol: the page's CSP allows
    no injected script tag."""
    if not AXE.exists():
        pytest.fail(f"no {AXE}: `make test` installs axe-core (npm)")
    rng = urlencode(week(today))
    found = {}
    for path in (f"admin/usage?{rng}&by=group", f"admin/capacity?{rng}", "admin/what-if"):
        admin.goto(prefix(hub) + path)
        if path == "admin/what-if":
            admin.locator('#whatif-form [name="days"]').fill("7")
            admin.locator('#whatif-form [name="add-model"]').fill("H100-80GB")
            admin.click("#whatif-run")
            expect(admin.locator("#whatif-result")).to_be_visible()
        admin.evaluate(AXE.read_text())
        found[path] = admin.evaluate(
            """async () => {
                const r = await axe.run(document,
                    {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21aa']}});
                const checked = r.passes.filter(v => v.id === 'color-contrast')
                    .reduce((n, v) => n + v.nodes.length, 0);
                return {checked, problems: r.violations.map(v => ({id: v.id, help: v.help,
                    nodes: v.nodes.map(n => n.target.join(' ') + ': ' + n.failureSummary)}))};
            }"""
        )
    assert all(f["checked"] >= 10 for f in found.values()), found
    assert all(not f["problems"] for f in found.values()), found
