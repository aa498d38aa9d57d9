"""Jobs where people look (issue 35): "My jobs" on the user page, jobs in the admin panel's
queue, lease table and pool map, in real Chromium against a real hub and pool service.

Alice has a training job running on one H100 (its runner's reports sent with the agent token,
as the job runner sends them) and a second one queued behind Bob's server on the other H100.
She sees both with their state, place in line and output, and cancels the queued one from the
page: it leaves the admin's queue. The admin's queue, lease table and map name the job and its
class; Bob sees none of Alice's jobs. With ``GPUPOOL_SCREENSHOTS=DIR`` the pages are saved
(the how-tos show them).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("playwright.sync_api")

from playwright.sync_api import expect

from jupyterhub_gpupool.data import data_path
from tests.fakes import HubEnv, request
from tests.fakes.panel import BASE, CHROMIUM, lease, log_in, prefix, shoot

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubEnv]:
    tmp = tmp_path_factory.mktemp("jobs")
    pool = tmp / "pool.yaml"
    pool.write_text(Path(data_path("demo-pool.yaml")).read_text())
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
        ),
    )
    with env.running():
        yield env


def submit(hub: HubEnv, user: str, name: str, offer: str = "h100") -> dict:
    """A job submitted with the user's own token, as ``job submit`` sends it."""
    token = hub.user_tokens.setdefault(user, hub.token(user))
    body = {"offer": offer, "class": "training", "name": name, "command": ["python", "train.py"]}
    r = request("POST", f"{hub.api}/jobs", token, body)
    assert r.status == 201, r.body
    return r.json()  # type: ignore[no-any-return]


def runner(hub: HubEnv, method: str, path: str, body: dict) -> dict:
    """A call of the job runner (the agent's token)."""
    r = request(method, f"{hub.api}/{path}", hub.agent_token, body)
    assert r.status == 200, r.body
    return r.json()  # type: ignore[no-any-return]


def test_my_jobs_on_the_user_page_and_jobs_in_the_admin_panel(hub: HubEnv, browser: Any) -> None:
    other = lease(hub, "bob", "h100", "notebook")  # one H100 for Bob's server
    assert other["state"] == "active", other
    running = submit(hub, "alice", "resnet")
    assert running["state"] == "granted", running
    runner(hub, "POST", f"jobs/{running['id']}/status", {"state": "running", "pid": 4242})
    output = "epoch 1/10 loss 2.31\nepoch 2/10 loss 1.87\n"
    runner(hub, "POST", f"jobs/{running['id']}/logs", {"offset": 0, "data": output})
    queued = submit(hub, "alice", "sweep")  # both H100s held: it waits
    assert queued["state"] == "queued" and queued["position"] == 1, queued

    alice = log_in(hub, browser, "alice")
    alice.goto(prefix(hub))
    jobs = alice.locator("#gpupool-jobs")
    row = jobs.locator(f'tr[data-job="{running["id"]}"]')
    expect(row).to_contain_text("resnet")
    expect(row).to_contain_text("1× H100 80GB")
    expect(row.locator(".class")).to_have_text("training")
    expect(row).to_contain_text("running")
    expect(row).to_contain_text(running["node"])
    waiting = jobs.locator(f'tr[data-job="{queued["id"]}"]')
    expect(waiting).to_contain_text("queued")
    expect(waiting.locator(".position")).to_have_text("1st in line")
    # the running job's output, from the page
    row.locator('button[data-job-action="logs"]').click()
    log = alice.locator("#gpupool-job-log")
    expect(log.locator("h3")).to_have_text("Output of resnet")
    expect(log.locator("pre")).to_have_text(output)
    # her leases name the jobs holding them, not their job:<id> server
    expect(
        alice.locator(f'#gpupool-leases tr[data-lease="{running["lease_id"]}"] td.job')
    ).to_contain_text("job resnet")
    assert "job:" not in alice.locator("main").inner_text()
    alice.locator("#my-jobs").scroll_into_view_if_needed()
    shoot(alice, "user-jobs")

    admin = log_in(hub, browser, "admin")
    admin.goto(prefix(hub) + "admin/leases")
    in_queue = admin.locator(f'#queue tr[data-lease="{queued["lease_id"]}"]')
    expect(in_queue.locator("td.job")).to_have_text("job sweep")
    expect(in_queue.locator("td.class")).to_have_text("training")
    expect(in_queue).to_contain_text("alice")
    held = admin.locator(f'#leases tr[data-lease="{running["lease_id"]}"]')
    expect(held.locator("td.job")).to_have_text("job resnet")
    expect(held.locator("td.class")).to_have_text("training")
    server = admin.locator(f'#leases tr[data-lease="{other["id"]}"]')
    expect(server.locator("td.class")).to_have_text("interactive")
    expect(server).to_contain_text("notebook")
    assert "job:" not in admin.locator("main").inner_text()  # no bare job:<id> server
    shoot(admin, "admin-leases-jobs")
    admin.goto(prefix(hub) + "admin/")
    cell = admin.locator("#pool-map .slice.wl-training")
    expect(cell).to_have_count(1)
    expect(cell).to_have_text("resnet · training")
    expect(cell).to_have_attribute(
        "aria-label", _contains("held by job resnet (training) of alice")
    )
    bobs = admin.locator('#pool-map .slice[aria-label*="held by bob (notebook), interactive"]')
    expect(bobs).to_have_count(1)
    shoot(admin, "admin-map-jobs")

    # Alice cancels the queued job from her page: it leaves the queue
    waiting.locator('button[data-job-action="cancel"]').click()
    expect(alice.locator("#gpupool-confirm-title")).to_have_text("Cancel this job")
    alice.click("#gpupool-confirm-ok")
    expect(alice.locator("#gpupool-status")).to_contain_text("Cancel: done.")
    expect(jobs.locator(f'tr[data-job="{queued["id"]}"]')).to_have_attribute(
        "data-state", "cancelled"
    )  # after the page's reload
    expect(
        jobs.locator(f'tr[data-job="{queued["id"]}"] button[data-job-action="cancel"]')
    ).to_have_count(0)
    got = request("GET", f"{hub.api}/jobs/{queued['id']}", hub.token("alice")).json()
    assert got["state"] == "cancelled", got  # type: ignore[index]
    admin.goto(prefix(hub) + "admin/leases")
    expect(admin.locator(f'#queue tr[data-lease="{queued["lease_id"]}"]')).to_have_count(0)
    expect(admin.locator(f'#leases tr[data-lease="{running["lease_id"]}"]')).to_have_count(1)

    # Bob sees his own lease and none of Alice's jobs, on the page or through the API
    bob = log_in(hub, browser, "bob")
    bob.goto(prefix(hub))
    expect(bob.locator("#gpupool-leases")).to_contain_text("notebook")
    expect(bob.locator("#gpupool-jobs")).to_contain_text("You have no jobs")
    assert "resnet" not in bob.locator("main").inner_text()
    r = request("GET", f"{hub.api}/jobs/{running['id']}/logs", hub.token("bob"))
    assert r.status == 404, r.body
    for page in (alice, admin, bob):
        page.context.close()


def _contains(text: str) -> re.Pattern[str]:
    """An attribute value that holds ``text``."""
    return re.compile(re.escape(text))
