"""What the pool pages' browser tests share: where Chromium is, the hub's base URL the panel
tests run under, logging in through the hub's form, screenshots for the docs, and a lease made
as the spawner makes one. Imported from this module (``tests.fakes.panel``), not re-exported by
``tests.fakes``: it needs Playwright, which only the browser tests have."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

from .hub import HubEnv, request

CHROMIUM = Path("/usr/bin/chromium")
VIEWPORT = {"width": 1280, "height": 860}
BASE = "/jh/"


def prefix(hub: HubEnv) -> str:
    return f"{hub.hub_url}{hub.service_prefix}"


def log_in(hub: HubEnv, browser: Any, user: str) -> Page:
    """A fresh context logged in through the hub's form; dialogs (alert) fail the test."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    page = context.new_page()
    page.on("dialog", lambda d: pytest.fail(f"a page opened a dialog: {d.message!r}"))
    page.on("pageerror", lambda e: print(f"page error: {e}"))
    page.on("console", lambda m: print(f"console {m.type}: {m.text}"))
    page.goto(f"{hub.hub_url}{BASE}hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", "any password")
    page.click("#login_submit")
    page.wait_for_url(f"**{BASE}hub/**")
    return page


def shoot(page: Page, name: str, full: bool = False) -> None:
    folder = os.environ.get("GPUPOOL_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=full)


def lease(hub: HubEnv, user: str, offer: str, server: str, bind: bool = True) -> dict:
    """A lease made by the spawner (and bound by its user's token)."""
    body = {"user": user, "server": server, "offer": offer}
    r = request("POST", f"{hub.api}/allocations", hub.spawner_token, body)
    assert r.status == 201, r.body
    out = r.json()
    if bind and out["state"] == "granted":
        token = hub.user_tokens.setdefault(user, hub.token(user)) if user in hub.users else None
        r = request(
            "POST", f"{hub.api}/allocations/{out['id']}/keepalive", token or hub.spawner_token
        )
        assert r.status == 200, r.body
        out = r.json()
    return out
