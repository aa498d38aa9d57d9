"""No GPU from a cross-site link; the form still chooses one; Services → gpupool opens a page.

JupyterHub starts a server straight from ``GET /hub/spawn?<options>`` (no XSRF check on a
GET), so any web page can send a logged-in user's browser there. Here a page served from
another origin (a tiny ``http.server`` on another loopback port) does exactly that, in real
Chromium, for a logged-in alice: the spawner must refuse (``allow_offer_from_query`` is off by
default) with a message on the spawn page, and neither a lease nor a server may exist
afterwards (asked through the hub and pool APIs with admin's token). Then alice takes the GPU
the honest way, with the form, and finds her lease on the pool's own page.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("playwright.sync_api")

from playwright.sync_api import Page, expect

from tests.fakes import request

CHROMIUM = Path("/usr/bin/chromium")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]

LAB = "#jp-main-dock-panel"
LAB_TIMEOUT = 120_000
REFUSED = "A GPU is not handed out from a link"


class Attacker:
    """A page on another origin that sends the visitor's browser to ``target``."""

    def __init__(self) -> None:
        self.target = ""
        attacker = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = (
                    "<!DOCTYPE html><title>Free cat pictures</title><p>Loading cats…</p>"
                    f"<script>location = {json.dumps(attacker.target)};</script>"
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/cats.html"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    site = Attacker()
    try:
        yield site
    finally:
        site.close()


def admin_token(login) -> str:
    """A token of the demo's admin (hub admin and pool admin), made through the hub's API
    with admin's browser session (cookie + XSRF header)."""
    page = login("admin")
    xsrf = next(c["value"] for c in page.context.cookies() if c["name"] == "_xsrf")
    url = page.url.split("/hub/")[0] + "/hub/api/users/admin/tokens"
    r = page.request.post(
        url,
        headers={"X-XSRFToken": xsrf, "Content-Type": "application/json"},
        data=json.dumps({"note": "cross-site test"}),
    )
    assert r.status == 201, r.text()
    return r.json()["token"]


def leases(demo, token: str, user: str) -> list[dict]:
    r = request("GET", f"{demo.url}/services/gpupool/api/v1/allocations?user={user}", token)
    assert r.status == 200, r.body
    return r.json()["items"]


def server_of(demo, token: str, user: str) -> dict:
    r = request("GET", f"{demo.url}/hub/api/users/{user}", token)
    assert r.status == 200, r.body
    return (r.json().get("servers") or {}).get("", {})


def test_a_link_from_another_site_starts_nothing(demo, login, attacker, shoot):
    token = admin_token(login)
    alice = login("alice")  # on the picker: logged in, no server
    for target in (
        f"{demo.url}/hub/spawn?gpupool_offer=h100",
        f"{demo.url}/hub/spawn/alice?opt-gpupool_offer=h100",  # JupyterHub 6's prefixed form
    ):
        attacker.target = target
        alice.goto(attacker.url)
        alice.wait_for_url(f"{demo.url}/hub/spawn**")
        error = alice.locator(".spawn-error-msg")
        expect(error).to_contain_text(REFUSED)
        expect(alice.locator("#gpupool-picker")).to_be_visible()  # the form, to choose in
        assert leases(demo, token, "alice") == []
        assert server_of(demo, token, "alice") == {}
    shoot(alice, "cross-site-refused", down_to="#spawn_form")


def test_the_form_still_takes_the_gpu_and_the_pool_page_shows_it(demo, login, shoot):
    token = admin_token(login)
    alice: Page = login("alice")
    alice.locator('#gpupool-picker .gpupool-offer[data-offer="h100"] input[type=radio]').check()
    alice.locator('#spawn_form [type="submit"]').click()
    expect(alice.locator(LAB)).to_be_visible(timeout=LAB_TIMEOUT)
    assert [le["state"] for le in leases(demo, token, "alice")] == ["active"]
    assert server_of(demo, token, "alice").get("ready") is True

    # the hub's Services menu links the pool's page: hub OAuth, then her lease and quota
    alice.goto(f"{demo.url}/hub/home")
    alice.locator("a.dropdown-toggle", has_text="Services").click()
    alice.locator("a.dropdown-item", has_text="gpupool").click()
    alice.wait_for_url(f"{demo.url}/services/gpupool/")
    expect(alice.locator("#gpupool-user")).to_have_text("alice")
    row = alice.locator("#gpupool-leases tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("1× H100 80GB")
    expect(row).to_contain_text("active")
    expect(alice.locator("#gpupool-quota")).to_contain_text("Up to 2 GPUs at a time")
    shoot(alice, "user-page", down_to="main")
