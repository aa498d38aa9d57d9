"""The admin panel and the user page in real Chromium, against a real hub (under the base URL
``/jh/``, not the default), the pool service with its simulated GPUs (in-process telemetry on
the demo pool, so a dynamic A100's instances are really made) and the hub's OAuth login.

An admin drains a node by a deadline and sees its leases under notice; re-partitions an idle
dynamic A100 after previewing the plan and sees the new layout on the map; edits a quota after
seeing its effect. A non-admin is refused every admin page and every admin API action (from
their own logged-in page, with the XSRF token). Hostile user, server, group and offer names are
shown as text on every page and never run; the map is walked with the keyboard alone. With
``GPUPOOL_SCREENSHOTS=DIR`` every page is saved there (the admin guide shows them).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from jinja2.utils import htmlsafe_json_dumps

pytest.importorskip("playwright.sync_api")

from playwright.sync_api import Page, expect

from jupyterhub_gpupool.data import data_path
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.poolconfig import gpu_uuid
from jupyterhub_gpupool.service.pages.base import BIDI_CONTROLS, shown
from tests.fakes import HubEnv, request
from tests.fakes.panel import BASE, CHROMIUM, lease, log_in, prefix, shoot

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]

#: Names no page may render as markup or evaluate as a template.
SCRIPT = "<script>window.pwned=1</script>"
IMG = '"><img src=x onerror="window.pwned=1">'
TEMPLATE = "{{7*7}}"
RTL = "\u202eevil\u202c-rtl"
LONG = "L" * 10_000 + SCRIPT  # 10 kB (the offer's display name: the pool config allows it)
HOSTILE_USERS = (SCRIPT, IMG, TEMPLATE, RTL)
#: Admin pages, relative to the service prefix.
ADMIN_PAGES = ("admin/", "admin/leases", "admin/nodes", "admin/quotas", "admin/audit")


def _pool() -> str:
    text = Path(data_path("demo-pool.yaml")).read_text()
    hostile = textwrap.dedent(
        f"""\
          - name: hostile
            kind: gpu
            count: 1
            models: [H100-80GB]
            display_name: {LONG!r}
        """
    )
    return text.replace("offers:\n", "offers:\n" + textwrap.indent(hostile, "  "), 1)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubEnv]:
    tmp = tmp_path_factory.mktemp("panel")
    pool = tmp / "pool.yaml"
    pool.write_text(_pool())
    env = HubEnv(
        tmp,
        f"sqlite:///{tmp}/pool.sqlite",
        pool,
        users=("alice", "bob", "admin"),
        base_url=BASE,
        service_args=(
            "--PoolService.reconcile_on_start=False",
            "--PoolService.reconcile_interval=0",
            "--PoolService.check_user_servers=False",
            "--PoolService.telemetry_source=sim",
            "--PoolService.sample_interval=1",
            "--PoolService.housekeeping_interval=1",
        ),
    )
    with env.running():
        yield env


@pytest.fixture(scope="module")
def admin(hub: HubEnv, browser: Any) -> Page:
    return log_in(hub, browser, "admin")


def no_markup_ran(page: Page) -> None:
    assert page.evaluate("window.pwned") is None
    assert page.locator("img").count() == 0


def test_hostile_names_are_text_on_every_page(hub: HubEnv, admin: Page) -> None:
    made = []
    for i, name in enumerate(HOSTILE_USERS):
        made.append(lease(hub, name, "t4-quarter", f"{name}-srv{i}"))
    made.append(lease(hub, "alice", "hostile", IMG))
    r = request(
        "PUT",
        f"{hub.api}/quotas/groups/{quote(IMG, safe='')}",
        hub.token("admin"),
        {"guarantee": 1, "limit": 2, "budget": None, "period": "month"},
    )
    assert r.status == 200, r.body
    for path in ADMIN_PAGES:
        admin.goto(prefix(hub) + path)
        if path == "admin/":
            expect(admin.locator("#pool-map .slice").first).to_be_visible()
            admin.locator("#pool-map .slice.busy, #pool-map .slice.idle").first.hover()
            expect(admin.locator("#map-detail")).to_contain_text("held by")
        no_markup_ran(admin)
        text = admin.locator("main").inner_text()
        if path in ("admin/leases", "admin/quotas"):
            for name in HOSTILE_USERS:
                assert shown(name) in text, f"{path}: {name!r} not shown as text"
        if path == "admin/leases":
            assert LONG[-200:] in text  # the offer's 10 kB display name, as text
    # the map's own detail line names a hostile holder as text
    admin.goto(prefix(hub) + "admin/")
    admin.select_option("#map-filters select[name=offer]", "t4-quarter")
    admin.locator("#pool-map .slice.busy, #pool-map .slice.idle").first.focus()
    expect(admin.locator("#map-detail")).to_contain_text("held by")
    no_markup_ran(admin)
    for le in made:
        request("DELETE", f"{hub.api}/allocations/{le['id']}?reason=admin", hub.spawner_token)


#: Every page, the user page included.
ALL_PAGES = ("", *ADMIN_PAGES, "admin/approvals", "admin/usage", "admin/capacity", "admin/what-if")


def test_bidi_controls_are_shown_on_every_page_never_obeyed(hub: HubEnv, admin: Page) -> None:
    """A user, a server, a group and a reclaim reason carrying U+202E: no page (nor its
    script's text, labels and titles) holds a raw bidirectional control; each is shown as
    ``[U+202E]``, and what a script sends back (the quota edit) still names the exact object."""
    token = hub.token("admin")
    made = [lease(hub, RTL, "t4-quarter", f"{RTL}-srv"), lease(hub, "admin", "t4-quarter", RTL)]
    r = request(
        "POST",
        f"{hub.api}/allocations/{made[1]['id']}/reclaim",
        token,
        {"reason": f"idle {RTL} for hours", "grace": 3600},
    )
    assert r.status == 200, r.body
    r = request(
        "PUT",
        f"{hub.api}/quotas/groups/{quote(RTL, safe='')}",
        token,
        {"guarantee": 1, "limit": 2, "budget": None, "period": "month", "exception": 3},
    )
    assert r.status == 200, r.body
    readable = """() => [document.body.innerText, document.title,
        ...[...document.querySelectorAll('[aria-label],[title],[alt],[placeholder]')].map(
            (e) => ['aria-label', 'title', 'alt', 'placeholder'].map(
                (a) => e.getAttribute(a) || '').join(' '))].join('\\n')"""
    for path in ALL_PAGES:
        admin.goto(prefix(hub) + path)
        if path == "admin/":
            expect(admin.locator("#pool-map .slice").first).to_be_visible()
        text = admin.evaluate(readable)
        assert not BIDI_CONTROLS.search(text), (path, BIDI_CONTROLS.findall(text))
        if path in ("", "admin/leases", "admin/quotas"):
            assert shown(RTL) in text, (path, text[:500])
    # the user page's notice names the reason, shown
    admin.goto(prefix(hub))
    expect(admin.locator("main")).to_contain_text(f"idle {shown(RTL)} for hours")
    # the quota edit still loads and saves the exact group (its name in the attribute exact)
    admin.goto(prefix(hub) + "admin/quotas")
    admin.locator(
        f'#quotas tr[data-kind="groups"][data-name="{RTL}"] [data-action="edit-quota"]'
    ).click()
    expect(admin.locator("#quota-form")).to_have_attribute("data-loaded", f"groups/{RTL}")
    expect(admin.locator("#quota-form-title")).to_have_text(f"Edit the quota of {shown(RTL)}")
    request("DELETE", f"{hub.api}/quotas/groups/{quote(RTL, safe='')}", token)
    for le in made:
        request("DELETE", f"{hub.api}/allocations/{le['id']}?reason=admin", hub.spawner_token)


#: Node names an agent may report (1–255 characters, any): they reach the map (its headings and
#: each slice's detail), the nodes page (its rows and the buttons' data-node) and the audit log;
#: so do the GPU model names it reports (1–64 characters: a model the catalog does not know
#: is shown by the name NVML gave), reversed here.
HOSTILE_NODES = (SCRIPT, IMG, TEMPLATE, RTL)
#: Labels reach no page (only ``GET pool``'s JSON); they are sent hostile all the same.
HOSTILE_LABELS = {"team": SCRIPT, "note": IMG, "tmpl": TEMPLATE, "rtl": RTL, IMG: "key"}


def inventory(hub: HubEnv, node: str, body: dict) -> Any:
    """``PUT nodes/{node}/inventory`` as the node's agent does (the name percent-encoded)."""
    return request(
        "PUT", f"{hub.api}/nodes/{quote(node, safe='')}/inventory", hub.agent_token, body
    )


def shown_model(product: str) -> str:
    """The name the pool gives a GPU product the catalog does not know (spaces become -)."""
    return default_catalog().model_for_nvml(product, 0).name


def as_tojson(value: str) -> str:
    """``value`` as the audit page shows it: Jinja's ``tojson`` (JSON, with <, >, & and ' as
    escapes so no markup can start)."""
    return str(htmlsafe_json_dumps(value))


def test_hostile_node_names_and_labels_are_text_on_every_page(hub: HubEnv, admin: Page) -> None:
    for i, name in enumerate(HOSTILE_NODES):
        model = HOSTILE_NODES[-1 - i]
        gpu = {"uuid": f"GPU-hostile-node-{i}", "index": 0, "model": model}
        r = inventory(hub, name, {"labels": HOSTILE_LABELS, "gpus": [gpu]})
        assert r.status == 200 and r.json()["name"] == name, r.body  # type: ignore[index]
    # what the API refuses, it refuses with a JSON error naming the field
    for node, body, field in (
        (LONG, {"gpus": []}, "name"),  # 10 kB: a node name has 1-255 characters
        ("fine", {"cluster": SCRIPT, "gpus": []}, "cluster"),  # clusters are the config's
        ("fine", {"labels": {"big": LONG}, "gpus": []}, "labels.big"),
        ("fine", {"gpus": [{"uuid": "GPU-fine-0", "model": LONG}]}, "gpus[0].model"),
        ("fine", {"gpus": [{"uuid": LONG, "model": "NVIDIA L4"}]}, "gpus[0].uuid"),
    ):
        r = inventory(hub, node, body)
        assert 400 <= r.status < 500, (field, r.status, r.body)
        error = r.json()["error"]  # type: ignore[index]
        assert error["field"] == field and error["code"] and error["message"], (field, error)
    # the map: each hostile node a heading, its GPU's detail names it, nothing runs
    admin.goto(prefix(hub) + "admin/")
    expect(admin.locator("#pool-map .slice").first).to_be_visible()
    headings = admin.eval_on_selector_all(
        "#pool-map li.node > h4", "els => els.map(e => e.textContent)"
    )
    for name in map(shown, HOSTILE_NODES):  # bidi controls shown, not obeyed
        assert any(h == name or h.startswith(name + " (") for h in headings), (name, headings)
    for i, name in enumerate(HOSTILE_NODES):
        admin.locator(f'#pool-map .slice[data-gpu="GPU-hostile-node-{i}"]').first.hover()
        model = shown(shown_model(HOSTILE_NODES[-1 - i]))
        expect(admin.locator("#map-detail")).to_contain_text(f"{shown(name)} · GPU 0 · {model}")
    assert "49" not in " ".join(headings)  # {{7*7}} is not a template anywhere
    no_markup_ran(admin)
    # the nodes page: each a row, shown as text; cordon one with its own button
    admin.goto(prefix(hub) + "admin/nodes")
    names = admin.eval_on_selector_all("td.name", "els => els.map(e => e.textContent)")
    gpus = admin.eval_on_selector_all("ul.gpus > li", "els => els.map(e => e.textContent)")
    for name in HOSTILE_NODES:
        assert shown(name) in names, (name, names)
        assert any(f"GPU 0 · {shown(shown_model(name))}" in g for g in gpus), (name, gpus)
    assert "49" not in names and not any("GPU 0 · 49" in g for g in gpus)
    no_markup_ran(admin)
    row = admin.locator("tr", has=admin.locator("td.name", has_text=TEMPLATE))
    row.locator('button[data-action="cordon"]').click()
    expect(admin.locator("#gpupool-confirm-title")).to_have_text(f"cordon {TEMPLATE}")
    admin.click("#gpupool-confirm-ok")
    expect(admin.locator("#gpupool-status")).to_contain_text("Cordon: done")
    no_markup_ran(admin)
    nodes = request("GET", f"{hub.api}/pool", hub.token("admin")).json()["clusters"]  # type: ignore[index]
    cordoned = {n["name"]: n["cordoned"] for c in nodes for n in c["nodes"]}
    assert cordoned[TEMPLATE] is True and cordoned[SCRIPT] is False
    # the audit log: the agents' reports and the cordon name the nodes, as escaped JSON text
    admin.goto(prefix(hub) + "admin/audit?kind=node-cordon")
    audit = admin.locator("#audit").inner_text()
    assert as_tojson(TEMPLATE) in audit and "user:admin" in audit
    no_markup_ran(admin)
    admin.goto(prefix(hub) + "admin/audit")
    audit = admin.locator("#audit").inner_text()
    for name in HOSTILE_NODES:
        assert as_tojson(name) in audit, (name, as_tojson(name))
    no_markup_ran(admin)
    # gone again: uncordoned, and no GPUs reported (the other tests' map stays as it was)
    request("POST", f"{hub.api}/nodes/{quote(TEMPLATE, safe='')}/uncordon", hub.token("admin"))
    for name in HOSTILE_NODES:
        assert inventory(hub, name, {"gpus": []}).status == 200


def test_the_map_is_walked_with_the_keyboard(hub: HubEnv, admin: Page) -> None:
    held = [
        lease(hub, "alice", "a100-1g", "kbd"),
        lease(hub, "bob", "a100-3g", "training"),
        lease(hub, "bob", "h100", "big"),
        lease(hub, "alice", "t4-quarter", "small"),
    ]
    admin.goto(prefix(hub) + "admin/")
    expect(admin.locator("#pool-map .slice").first).to_be_visible()
    # every MIG slice shows its whole profile name, never clipped ("1g.10" for 1g.10gb)
    labels = admin.eval_on_selector_all(
        "#pool-map .slice.labelled",
        "cells => cells.map(c => [c.textContent, c.scrollWidth <= c.clientWidth])",
    )
    assert ["1g.10gb", True] in labels and ["3g.40gb", True] in labels, labels
    assert all(fits for _, fits in labels), labels
    # Tab from the filters lands on the map's one tab stop
    admin.locator("#map-filters input[name=live]").focus()
    admin.keyboard.press("Tab")
    first = admin.evaluate("document.activeElement.dataset.slice")
    assert first is not None
    expect(admin.locator("#map-detail")).not_to_be_empty()
    admin.keyboard.press("ArrowRight")
    second = admin.evaluate(
        "[document.activeElement.dataset.gpu, document.activeElement.dataset.slice]"
    )
    assert second[1] is not None and second != [None, first]
    admin.keyboard.press("ArrowDown")  # the next GPU
    third = admin.evaluate("document.activeElement.dataset.gpu")
    assert third != second[0]
    admin.keyboard.press("End")
    admin.keyboard.press("Home")
    assert admin.evaluate("document.activeElement.dataset.slice") == first
    # only one slice is in the tab order (roving tabindex)
    assert admin.locator('#pool-map [tabindex="0"]').count() == 1
    shoot(admin, "admin-map", full=True)
    for le in held:
        request("DELETE", f"{hub.api}/allocations/{le['id']}?reason=admin", hub.spawner_token)


def test_an_admin_drains_a_node_and_its_leases_get_notices(hub: HubEnv, admin: Page) -> None:
    one = lease(hub, "alice", "h100", "drain-one")
    two = lease(hub, "bob", "h100", "drain-two")
    assert {one["node"], two["node"]} == {"sim-h100"}
    admin.goto(prefix(hub) + "admin/nodes")
    admin.click('tr[data-node="sim-h100"] button[data-action="drain"]')
    dialog = admin.locator("#gpupool-confirm")
    expect(dialog).to_be_visible()
    admin.fill('#gpupool-confirm [name="deadline"]', "2099-01-01T12:00")
    shoot(admin, "admin-drain-dialog")
    admin.click("#gpupool-confirm-ok")
    expect(admin.locator("#gpupool-status")).to_contain_text(
        "sim-h100 is draining; 2 leases got a notice, 0 grants released."
    )
    admin.goto(prefix(hub) + "admin/leases")
    for le in (one, two):
        row = admin.locator(f'#leases tr[data-lease="{le["id"]}"]')
        expect(row).to_contain_text("drain notice")
    shoot(admin, "admin-leases", full=True)
    # alice sees it on her own page
    alice = log_in(hub, admin.context.browser, "alice")
    alice.goto(prefix(hub))
    notice = alice.locator(f'.notice[data-lease="{one["id"]}"]')
    expect(notice.locator(".notice-heading")).to_have_text(
        "Node maintenance: this GPU's node is being drained"
    )
    expect(notice).to_contain_text("It cannot be kept: its node is drained for maintenance")
    expect(notice.locator("button")).to_have_count(0)  # no Keep control where it cannot keep
    shoot(alice, "my-gpus", full=True)
    alice.context.close()
    admin.goto(prefix(hub) + "admin/nodes")
    admin.click('tr[data-node="sim-h100"] button[data-action="uncordon"]')
    admin.click("#gpupool-confirm-ok")
    # the uncordon undoes the drain and its notices, and says how many
    expect(admin.locator("#gpupool-status")).to_contain_text("2 drain notices withdrawn")
    for le in (one, two):
        now = request("GET", f"{hub.api}/allocations/{le['id']}", hub.token("admin")).json()
        assert now["state"] == "active" and now["reclaim"] is None  # type: ignore[index]
        request("DELETE", f"{hub.api}/allocations/{le['id']}?reason=admin", hub.spawner_token)


def test_an_admin_cancels_a_notice_from_the_panel(hub: HubEnv, admin: Page) -> None:
    held = lease(hub, "alice", "h100", "cancel-one")
    path = f"{hub.api}/allocations/{held['id']}"
    admin_token = hub.token("admin")
    r = request("POST", f"{path}/reclaim", admin_token, {"grace": 3600})
    assert r.status == 200, r.body
    admin.goto(prefix(hub) + "admin/leases")
    row = admin.locator(f'#leases tr[data-lease="{held["id"]}"]')
    expect(row).to_contain_text("admin notice")
    row.locator('button[data-action="cancel-notice"]').click()
    admin.fill('#gpupool-confirm [name="reason"]', "keep going")
    admin.click("#gpupool-confirm-ok")
    expect(admin.locator("#gpupool-status")).to_contain_text("Cancel notice: done.")
    now = request("GET", path, admin_token).json()
    assert now["state"] == "active" and now["reclaim"] is None  # type: ignore[index]
    events = request(
        "GET", f"{hub.api}/events?lease={held['id']}&kind=reclaim-cancelled", admin_token
    ).json()
    [event] = events["items"]  # type: ignore[index]
    assert event["data"]["reason"] == "keep going" and event["actor"].endswith("admin")
    # alice is told on her page: no notice any more, and who withdrew it and why
    alice = log_in(hub, admin.context.browser, "alice")
    alice.goto(prefix(hub))
    expect(alice.locator(f'.notice[data-lease="{held["id"]}"]')).to_have_count(0)
    told = alice.locator(f'.withdrawn[data-lease="{held["id"]}"]')
    expect(told).to_contain_text("An administrator withdrew the admin notice on your 1× H100 80GB")
    expect(told).to_contain_text("keep going")
    alice.context.close()
    # both H100s held: a third request waits, and the queue says for what, in words
    other = lease(hub, "bob", "h100", "cancel-two")
    waiting = lease(hub, "admin", "h100", "cancel-wait", bind=False)
    assert waiting["state"] == "queued", waiting
    admin.reload()
    row = admin.locator(f'#leases tr[data-lease="{held["id"]}"]')
    expect(row.locator('button[data-action="cancel-notice"]')).to_have_count(0)
    queued = admin.locator(f'#queue tr[data-lease="{waiting["id"]}"]')
    expect(queued).to_contain_text("waiting for a free 1× H100 80GB")
    expect(queued).not_to_contain_text("Any other refusal")
    expect(queued).not_to_contain_text("is free now")
    for le in (waiting, held, other):
        request("DELETE", f"{hub.api}/allocations/{le['id']}?reason=admin", hub.spawner_token)


def test_an_admin_reclaims_and_extends_from_the_lease_table(hub: HubEnv, admin: Page) -> None:
    held = lease(hub, "alice", "t4-quarter", "reclaim-me")
    admin.goto(prefix(hub) + "admin/leases")
    admin.click(f'#leases tr[data-lease="{held["id"]}"] button[data-action="reclaim"]')
    admin.fill('#gpupool-confirm [name="grace"]', "30")
    admin.fill('#gpupool-confirm [name="reason"]', "maintenance")
    shoot(admin, "admin-reclaim-dialog")
    admin.click("#gpupool-confirm-ok")
    expect(admin.locator("#gpupool-status")).to_contain_text("Reclaim: done")
    admin.wait_for_load_state()
    row = admin.locator(f'#leases tr[data-lease="{held["id"]}"]')
    expect(row).to_contain_text("admin notice")
    row.locator('button[data-action="extend"]').click()
    admin.fill('#gpupool-confirm [name="minutes"]', "60")
    admin.click("#gpupool-confirm-ok")
    expect(admin.locator("#gpupool-status")).to_contain_text("Extend: done")
    events = request(
        "GET", f"{hub.api}/events?lease={held['id']}&kind=reclaim-extended", hub.token("admin")
    ).json()
    assert [e["actor"] for e in events["items"]] == ["user:admin"]
    request("DELETE", f"{hub.api}/allocations/{held['id']}?reason=admin", hub.spawner_token)


def test_an_admin_repartitions_an_idle_dynamic_gpu_and_sees_it_on_the_map(
    hub: HubEnv, admin: Page
) -> None:
    gpu = gpu_uuid("sim-a100", 1)
    admin.goto(prefix(hub) + "admin/nodes")
    admin.click(f'li[data-gpu="{gpu}"] button[data-action="repartition"]')
    admin.fill('#gpupool-confirm [name="layout"]', "3g.40gb@0 3g.40gb@5")  # 5: not a start
    admin.click("#repartition-preview-button")
    expect(admin.locator("#repartition-preview")).to_contain_text("start")
    admin.fill('#gpupool-confirm [name="layout"]', "3g.40gb@0, 3g.40gb@4")
    admin.click("#repartition-preview-button")
    plan = admin.locator("#repartition-plan")
    expect(plan).to_contain_text("Comes: 3g.40gb@0, 3g.40gb@4")
    expect(plan).to_contain_text("In the way: nothing")
    shoot(admin, "admin-repartition-plan")
    admin.click("#gpupool-confirm-ok")
    expect(admin.locator("#gpupool-status")).to_contain_text("Re-partition #")
    admin.goto(prefix(hub) + "admin/")
    for start in (0, 4):
        cell = admin.locator(f'#pool-map .slice[data-gpu="{gpu}"][data-slice="3g.40gb@{start}"]')
        expect(cell).to_be_visible(timeout=60_000)
    # the node's simulated agent makes both; the re-partition is done and the GPU free again
    expect(
        admin.locator(f'#pool-map .slice.free[data-gpu="{gpu}"][data-slice="3g.40gb@4"]')
    ).to_be_visible(timeout=60_000)
    admin.goto(prefix(hub) + "admin/nodes")
    shoot(admin, "admin-nodes", full=True)


def test_an_admin_edits_a_quota_after_seeing_its_effect(hub: HubEnv, admin: Page) -> None:
    held = lease(hub, "bob", "t4-quarter", "quota")
    admin.goto(prefix(hub) + "admin/quotas")
    form = admin.locator("#quota-form")
    form.locator('[name="name"]').fill("bob")
    form.locator('[name="guarantee"]').fill("-1")
    admin.click("#quota-save")
    expect(admin.locator("#quota-error")).to_contain_text("guarantee")
    assert form.locator('[name="guarantee"]').get_attribute("aria-invalid") == "true"
    form.locator('[name="guarantee"]').fill("0")
    form.locator('[name="limit"]').fill("1")
    admin.click("#quota-preview")
    expect(admin.locator("#quota-effect")).to_contain_text("1 lease(s) would become borrowed")
    shoot(admin, "admin-quotas", full=True)
    admin.click("#quota-save")
    expect(admin.locator("#gpupool-status")).to_contain_text("Saved the quota of bob")
    admin.wait_for_load_state()
    expect(admin.locator('#quotas tr[data-kind="users"][data-name="bob"]')).to_contain_text("api")
    assert request("GET", f"{hub.api}/allocations/{held['id']}", hub.spawner_token).json()[
        "borrowed"
    ]
    admin.goto(prefix(hub) + "admin/audit?kind=quota-set")
    expect(admin.locator("#audit")).to_contain_text("user:admin")
    shoot(admin, "admin-audit", full=True)
    request("DELETE", f"{hub.api}/quotas/users/bob", hub.token("admin"))
    request("DELETE", f"{hub.api}/allocations/{held['id']}?reason=admin", hub.spawner_token)


#: Quotas the round-trip test edits: every field set (an exception ceiling, a budget, a period
#: other than the default), and every nullable one null.
ROUND_TRIP = {
    ("users", "round-trip"): {
        "guarantee": 0.3,
        "limit": 2.5,
        "budget": 123.25,
        "period": "week",
        "exception": 6,
        "budget_action": "stop",
        "budget_minimum": 1.5,
    },
    ("groups", "nulls"): {
        "guarantee": 0,
        "limit": None,
        "budget": None,
        "period": "day",
        "exception": None,
        "budget_action": "refuse",
        "budget_minimum": 0,
    },
}


def test_the_quota_form_saves_back_exactly_what_it_loaded(hub: HubEnv, admin: Page) -> None:
    """Edit, then Save without a change: the quota (as the API answers it) is byte-identical,
    the exception ceiling included (the form once sent four fields and lost it)."""
    token = hub.token("admin")
    for (kind, name), quota in ROUND_TRIP.items():
        r = request("PUT", f"{hub.api}/quotas/{kind}/{name}", token, quota)
        assert r.status == 200, r.body
        before = request("GET", f"{hub.api}/quotas/{kind}/{name}", token).body
        assert before == r.body
        admin.goto(prefix(hub) + "admin/quotas")
        row = admin.locator(f'#quotas tr[data-kind="{kind}"][data-name="{name}"]')
        if quota["exception"] is not None:
            expect(row).to_contain_text("6")  # the table shows the ceiling too
        row.locator('[data-action="edit-quota"]').click()
        form = admin.locator("#quota-form")
        expect(form).to_have_attribute("data-loaded", f"{kind}/{name}")
        shown = "" if quota["exception"] is None else str(quota["exception"])
        assert form.locator('[name="exception"]').input_value() == shown
        assert form.locator('[name="budget_action"]').input_value() == quota["budget_action"]
        with admin.expect_request(lambda q: q.method == "PUT") as sent:
            admin.click("#quota-save")
        expect(admin.locator("#gpupool-status")).to_contain_text(f"Saved the quota of {name}")
        after = request("GET", f"{hub.api}/quotas/{kind}/{name}", token).body
        assert after == before, (before, after)
        # what the form sent: every field the API takes, as loaded
        assert json.loads(sent.value.post_data) == quota
        request("DELETE", f"{hub.api}/quotas/{kind}/{name}", token)


#: Every admin API action, as the panel's script would send it (cookie auth + XSRF header).
ADMIN_CALLS = (
    ("GET", "pool/map", None),
    ("GET", "pool/history", None),
    ("GET", "events", None),
    ("GET", "usage", None),
    ("GET", "repartitions", None),
    ("GET", "quotas/users/alice", None),
    ("PUT", "quotas/users/alice", {"guarantee": 9, "limit": 9, "budget": None, "period": "month"}),
    ("PATCH", "quotas/users/alice", {"limit": 9}),
    ("DELETE", "quotas/users/alice", None),
    ("POST", "quotas/users/alice/preview", {"guarantee": 9}),
    ("POST", "nodes/sim-h100/cordon", {}),
    ("POST", "nodes/sim-h100/uncordon", {}),
    ("POST", "nodes/sim-h100/drain", {"deadline": "2099-01-01T00:00:00Z"}),
    ("POST", "nodes/sim-a100/repartitions", {"gpu": "x", "layout": [], "dry_run": True}),
    ("DELETE", "repartitions/1", None),
    ("POST", "allocations/{id}/reclaim", {"immediately": True}),
    ("POST", "allocations/{id}/extend", {"seconds": 60}),
    ("PUT", "reclaim/policies", {"default": {"idle_timeout": "1h"}}),
)


def test_a_non_admin_is_refused_every_admin_page_and_action(hub: HubEnv, browser: Any) -> None:
    held = lease(hub, "bob", "t4-quarter", "not-yours")
    alice = log_in(hub, browser, "alice")
    for path in ADMIN_PAGES:
        r = alice.goto(prefix(hub) + path)
        assert r is not None and r.status == 403, path
        expect(alice.locator("#gpupool-error")).to_contain_text("custom:gpupool:admin")
    alice.goto(prefix(hub))
    calls = [(m, p.format(id=held["id"]), b) for m, p, b in ADMIN_CALLS]
    statuses = alice.evaluate(
        """async (calls) => {
            const api = document.querySelector('meta[name="gpupool-api"]').content;
            const xsrf = document.querySelector('meta[name="gpupool-xsrf"]').content;
            const out = [];
            for (const [method, path, body] of calls) {
                const r = await fetch(api + path, {method, credentials: "same-origin",
                    headers: {"X-XSRFToken": xsrf, "Content-Type": "application/json"},
                    body: body === null ? undefined : JSON.stringify(body)});
                out.push([method + " " + path, r.status, (await r.json()).error?.code]);
            }
            return out;
        }""",
        calls,
    )
    refused = {label: (status, code) for label, status, code in statuses}
    assert all(s == 403 and c == "forbidden" for s, c in refused.values()), refused
    # her own data answers with the XSRF token; a script without it is not even identified
    me = alice.evaluate(
        """async () => {
            const api = document.querySelector('meta[name="gpupool-api"]').content;
            const xsrf = document.querySelector('meta[name="gpupool-xsrf"]').content;
            const get = async (headers) =>
                (await fetch(api + 'users/me', {credentials: "same-origin", headers})).status;
            return [await get({"X-XSRFToken": xsrf}), await get({})];
        }"""
    )
    assert me == [200, 401]
    # and nothing changed
    assert (
        request("GET", f"{hub.api}/allocations/{held['id']}", hub.spawner_token).json()["state"]
        == "active"
    )
    alice.context.close()
    request("DELETE", f"{hub.api}/allocations/{held['id']}?reason=admin", hub.spawner_token)


def test_a_form_post_needs_the_hubs_xsrf_token(hub: HubEnv, browser: Any) -> None:
    held = lease(hub, "alice", "t4-quarter", "xsrf")
    alice = log_in(hub, browser, "alice")
    alice.goto(prefix(hub))
    status = alice.evaluate(
        """async (id) => (await fetch(location.pathname + 'keep/' + id,
            {method: "POST", credentials: "same-origin", redirect: "manual"})).status""",
        held["id"],
    )
    assert status in (403, 0), status  # refused, or sent to log in again (opaque redirect)
    # with the page's token (the form's hidden _xsrf, as the browser submits it) it passes
    token = alice.get_attribute('meta[name="gpupool-xsrf"]', "content")
    assert token and not token.startswith("b'")
    url = f"{prefix(hub)}keep/{held['id']}"
    kept = alice.context.request.post(url, form={"_xsrf": token}, max_redirects=0)
    assert kept.status == 302 and kept.headers["location"].endswith(f"?kept={held['id']}")
    forged = alice.context.request.post(url, form={"_xsrf": "2|forged"}, max_redirects=0)
    assert forged.status in (302, 403) and "kept=" not in forged.headers.get("location", "")
    api_status = alice.evaluate(
        """async (id) => (await fetch(document.querySelector('meta[name="gpupool-api"]').content
            + 'allocations/' + id + '/keepalive', {method: "POST", credentials: "same-origin",
            body: "{}"})).status""",
        held["id"],
    )
    assert api_status in (401, 403)
    alice.context.close()
    request("DELETE", f"{hub.api}/allocations/{held['id']}?reason=admin", hub.spawner_token)


def test_every_page_sends_a_strict_content_security_policy(hub: HubEnv, admin: Page) -> None:
    for path in ("", *ADMIN_PAGES):
        r = admin.goto(prefix(hub) + path)
        assert r is not None and r.status == 200
        csp = r.headers["content-security-policy"]
        assert (
            "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
        )
        # every link and script of the page stays under the non-default base URL
        for attr in admin.eval_on_selector_all(
            "script[src], link[href]",
            "els => els.map(e => e.getAttribute('src') || e.getAttribute('href'))",
        ):
            assert attr.startswith(f"{BASE}services/gpupool/static/"), attr
