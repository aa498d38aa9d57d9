"""The admin panel's Approvals page in real Chromium, against a real hub (base URL ``/jh/``) and
the pool service: requests asked through the API (an offer that needs approval, an exception
beyond a quota's limit, one from a user with a hostile name and reason) are listed with why and
for how long; an admin approves one for a smaller offer, sees a too-long duration and a blank
denial refused in the dialog naming the field, denies another; the user page shows the ask and
the decision; a non-admin is refused the page. With ``GPUPOOL_SCREENSHOTS=DIR`` the page is
saved there (the docs show it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("playwright.sync_api")

from playwright.sync_api import expect

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.service.pages.base import shown
from tests.fakes import HubEnv, request, write_pool

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="no Chromium"),
]

BASE = "/jh/"
HOSTILE_USER = '"><img src=x onerror="window.pwned=1">'
HOSTILE_REASON = "<script>window.pwned=1</script> {{7*7}} \u202eevil\u202c"
POOL: dict[str, Any] = {
    "nodes": [
        {"name": "h100", "cpu_milli": 64000, "memory_mib": 262144,
         "gpus": [{"model": "H100-80GB", "count": 4}]},
    ],
    "offers": [
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"], "display_name": "1× H100"},
        {"name": "h100x2", "kind": "gpu", "count": 2, "models": ["H100-80GB"],
         "display_name": "2× H100"},
        {"name": "big", "kind": "gpu", "count": 4, "models": ["H100-80GB"],
         "display_name": "4× H100 (by approval)", "approval": "required"},
    ],
    "quotas": {"default": {"guarantee": 1, "limit": 1, "exception": 2},
               "users": {"dana": {"limit": 8}, HOSTILE_USER: {"limit": 8}}},
}  # fmt: skip


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubEnv]:
    tmp = tmp_path_factory.mktemp("approvals")
    url = f"sqlite:///{tmp}/pool.sqlite"
    upgrade(url)
    env = HubEnv(
        tmp,
        url,
        write_pool(tmp, yaml.safe_dump(POOL, allow_unicode=True)),
        users=("alice", "dana", "erin", "admin"),
        base_url=BASE,
        service_args=(
            "--PoolService.reconcile_on_start=False",
            "--PoolService.reconcile_interval=0",
            "--PoolService.check_user_servers=False",
        ),
    )
    with env.running():
        yield env


def ask(hub: HubEnv, user: str, offer: str, reason: str, duration: float | None = None) -> dict:
    """A request as the hub's spawner makes it from the spawn page's form."""
    body: dict[str, Any] = {"user": user, "server": "", "offer": offer, "reason": reason}
    if duration is not None:
        body["duration"] = duration
    r = request("POST", f"{hub.api}/allocations", hub.spawner_token, body)
    assert r.status == 201, r.body
    assert r.json()["state"] == "awaiting_approval"
    return r.json()


def lease(hub: HubEnv, lease_id: str) -> dict:
    r = request("GET", f"{hub.api}/allocations/{lease_id}", hub.token("admin"))
    assert r.status == 200, r.body
    return r.json()


def row(lease_id: str) -> str:
    return f'#approvals tr[data-lease="{lease_id}"]'


def test_an_admin_approves_for_less_and_denies_with_a_reason(
    hub: HubEnv, hub_login: Any, shoot: Any
) -> None:
    big = ask(hub, "dana", "big", "fine-tuning before the paper deadline")
    extra = ask(hub, "erin", "h100x2", "two runs side by side", duration=3 * 86400)
    hostile = ask(hub, HOSTILE_USER, "big", HOSTILE_REASON)
    admin = hub_login(hub, "admin")
    admin.goto(f"{hub.hub_url}{hub.service_prefix}admin/approvals")
    rows = admin.locator("#approvals tbody tr")
    expect(rows).to_have_count(3)
    assert admin.locator(row(big["id"]) + " td.reason").inner_text() == (
        "fine-tuning before the paper deadline"
    )
    assert "offer needs approval" in admin.locator(row(big["id"])).inner_text()
    erin = admin.locator(row(extra["id"])).inner_text()
    assert "beyond the quota's limit (exception up to 2 GPUs)" in erin and "3 d" in erin
    # hostile names and reasons are text: nothing ran, nothing was evaluated
    assert admin.locator(row(hostile["id"]) + " td.name").first.inner_text() == HOSTILE_USER
    # as text, its bidirectional controls shown ([U+202E]), not obeyed
    assert admin.locator(row(hostile["id"]) + " td.reason").inner_text() == shown(HOSTILE_REASON)
    assert admin.evaluate("window.pwned") is None and admin.locator("main img").count() == 0
    assert "49" not in admin.locator("#approvals").inner_text()
    shoot(admin, "admin-approvals", down_to="#approvals")

    # approve dana's for the 2-GPU offer (the dialog lists the smaller offers)
    admin.click(row(big["id"]) + ' button[data-action="approve"]')
    offer = admin.locator('#gpupool-confirm [name="offer"]')
    assert offer.locator("option").all_inner_texts() == [
        "as asked (4× H100 (by approval))",
        "1× H100",
        "2× H100",
    ]
    offer.select_option("h100x2")
    admin.fill('#gpupool-confirm [name="note"]', "two are free this week")
    admin.click("#gpupool-confirm-ok")
    expect(admin.locator(row(big["id"]))).to_have_count(0)  # the page reloaded without it
    done = lease(hub, big["id"])
    assert done["state"] == "granted" and done["offer"] == "h100x2"
    assert done["approval"]["asked_offer"] == "big"
    assert done["approval"]["decided_by"] == "user:admin"

    # erin's: longer than asked is refused in the dialog, naming the field; then denied
    admin.click(row(extra["id"]) + ' button[data-action="approve"]')
    duration = admin.locator('#gpupool-confirm [name="duration"]')
    assert duration.input_value() == "72"
    duration.fill("100")
    admin.click("#gpupool-confirm-ok")
    expect(admin.locator("#gpupool-confirm-error")).to_contain_text("duration:")
    assert duration.get_attribute("aria-invalid") == "true"
    admin.click('#gpupool-confirm button[value="cancel"]')
    assert lease(hub, extra["id"])["state"] == "awaiting_approval"
    admin.click(row(extra["id"]) + ' button[data-action="deny"]')
    admin.click("#gpupool-confirm-ok")  # no reason
    expect(admin.locator("#gpupool-confirm-error")).to_contain_text("reason")
    admin.fill('#gpupool-confirm [name="reason"]', "one GPU is enough for two runs")
    admin.click("#gpupool-confirm-ok")
    expect(admin.locator(row(extra["id"]))).to_have_count(0)
    denied = lease(hub, extra["id"])
    assert denied["release_reason"] == "denied"
    assert denied["approval"]["note"] == "one GPU is enough for two runs"
    expect(admin.locator("#approvals tbody tr")).to_have_count(1)

    # erin's own page says it was denied; dana's that it was approved
    page = hub_login(hub, "erin")
    page.goto(f"{hub.hub_url}{hub.service_prefix}")
    expect(page.locator("#gpupool-asks")).to_contain_text(
        "denied by user:admin: one GPU is enough for two runs"
    )
    page = hub_login(hub, "dana")
    page.goto(f"{hub.hub_url}{hub.service_prefix}")
    expect(page.locator("#gpupool-leases")).to_contain_text("approved by user:admin")


def test_a_non_admin_is_refused_the_approvals_page_and_actions(hub: HubEnv, hub_login: Any) -> None:
    page = hub_login(hub, "alice")
    r = page.goto(f"{hub.hub_url}{hub.service_prefix}admin/approvals")
    assert r is not None and r.status == 403
    for action, body in (("approve", {}), ("deny", {"reason": "no"})):
        r = request("POST", f"{hub.api}/allocations/x/{action}", hub.token("alice"), body)
        assert r.status == 403 and r.json()["error"]["code"] == "forbidden"
