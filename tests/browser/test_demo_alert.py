"""The demo shows an alert: on the Nodes page the admin makes a simulated GPU fall off the bus
(its *Simulate GPU loss* button, shown for the GPUs the service simulates itself) and the admin
panel shows the GPUPoolGPUUnhealthy banner, linking to the Nodes page, which shows the GPU
unhealthy. *Bring GPU back* and the banner goes. The demo runs with its defaults (alerts every
30 s)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("playwright.sync_api")

from playwright.sync_api import Page, expect

CHROMIUM = Path("/usr/bin/chromium")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]

#: How long the banner may take to show: generous patience (one alert round is 30 s), not the
#: claim; the time it took is printed.
PATIENCE = 120.0

#: The panel's own way of calling the API (reads here): the session cookie and the hub's XSRF
#: token.
CALL = """async ([path, method, body]) => {
  const api = document.querySelector('meta[name="gpupool-api"]').content;
  const xsrf = document.querySelector('meta[name="gpupool-xsrf"]').content;
  const init = {method, headers: {"X-XSRFToken": xsrf, "Content-Type": "application/json"}};
  if (body !== null) init.body = JSON.stringify(body);
  const r = await fetch(api + path, init);
  return {status: r.status, body: await r.json()};
}"""


def call(page: Page, path: str, method: str = "GET", body: dict | None = None) -> dict:
    return page.evaluate(CALL, [path, method, body])


def banner_after_reloads(page: Page, url: str, present: bool) -> float:
    """Reload ``url`` until the alert banner is there (or gone); the seconds it took."""
    started = time.monotonic()
    while True:
        page.goto(url)
        if (page.locator("#gpupool-alerts").count() > 0) == present:
            return time.monotonic() - started
        assert time.monotonic() - started < PATIENCE, f"banner present={present} never came"
        page.wait_for_timeout(1000)


def press(page: Page, nodes: str, gpu: str, label: str) -> None:
    """On the Nodes page, press the GPU's simulated-fault button (``label``) and confirm."""
    page.goto(nodes)
    button = page.locator(f'li[data-gpu="{gpu}"] button[data-action="simulated-fault"]')
    expect(button).to_have_text(label)
    button.click()
    page.locator("#gpupool-confirm-ok").click()
    expect(page.locator("#gpupool-status")).to_contain_text(f"{label}: done.")


def test_a_lost_simulated_gpu_shows_on_the_admin_panel(demo, login, shoot):
    page = login("admin")
    panel = f"{demo.url}/services/gpupool/admin/"
    nodes = f"{panel}nodes"
    page.goto(panel)
    expect(page.locator("#gpupool-alerts")).to_have_count(0)
    page.goto(nodes)
    gpu = page.locator('tr[data-node="node-h100"] li[data-gpu]').first.get_attribute("data-gpu")
    assert gpu

    press(page, nodes, gpu, "Simulate GPU loss")
    took = banner_after_reloads(page, panel, present=True)
    print(f"the alert banner showed {took:.1f} s after the GPU was lost")
    alert = page.locator("#gpupool-alerts li.alert-critical")
    expect(alert).to_have_count(1)
    expect(alert).to_contain_text(f"GPU node-h100/{gpu} is unhealthy or lost")
    shoot(page, "admin-alert-banner", down_to="#gpupool-alerts")
    alert.get_by_role("link", name="Nodes").click()  # the page of the cause
    page.wait_for_url("**/admin/nodes")
    expect(page.locator(f'li[data-gpu="{gpu}"] .gpu-unhealthy')).to_have_text("unhealthy")
    listed = call(page, "alerts")["body"]["items"]
    assert [(a["name"], a["subject"]) for a in listed] == [
        ("GPUPoolGPUUnhealthy", f"node-h100/{gpu}")
    ]

    press(page, nodes, gpu, "Bring GPU back")
    banner_after_reloads(page, panel, present=False)
    kinds = [e["kind"] for e in call(page, "events?kind=alert-raised")["body"]["items"]]
    kinds += [e["kind"] for e in call(page, "events?kind=alert-resolved")["body"]["items"]]
    assert kinds == ["alert-raised", "alert-resolved"]
    # the real GPUs' nodes (none in the demo) and other pages have no such button
    page.goto(panel)
    expect(page.locator('button[data-action="simulated-fault"]')).to_have_count(0)
