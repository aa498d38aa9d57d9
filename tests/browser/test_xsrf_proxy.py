"""A stray ``Authorization`` header never switches the XSRF check off.

JupyterHub skips its XSRF check only for a request that a token actually authenticated. Behind
a Basic-auth reverse proxy (nginx ``auth_basic``, Kerberos/Negotiate) the browser attaches an
``Authorization`` header to every request to the site by itself, cross-site form posts too; if
the header's mere presence skipped the check, any page on another origin could cordon, drain,
approve, deny and reclaim as the logged-in admin.

Against a real hub and pool service: every state-changing API and page route (listed from the
service's own routes, so a new one is covered the day it is added) is sent the admin's cookie,
a ``Basic`` or bogus ``token``/``Bearer`` header and no XSRF token, and is refused; the same
cookie with the page's XSRF token, or a real token, still works. Then real Chromium logs in
through a Basic-auth reverse proxy started here (which forwards the header, as nginx does) and
visits pages on another origin whose forms post themselves to the pool: the proxy sees each
post arrive with the pool's cookie and the Basic header, the pool refuses each, and nothing
changes (no audit event, node, lease or quota moves).
"""

from __future__ import annotations

import base64
import http.client
import re
import textwrap
import threading
from collections.abc import Iterator
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

pytest.importorskip("playwright.sync_api")

from playwright.sync_api import Page

from jupyterhub_gpupool.data import data_path
from jupyterhub_gpupool.service import pages
from jupyterhub_gpupool.service.apihandlers import (
    admin,
    agent,
    allocations,
    approvals,
    operate,
    planning,
    reclaim,
    restart,
    users,
)
from jupyterhub_gpupool.service.apihandlers.base import APIHandler
from tests.fakes import HubEnv, request

CHROMIUM = Path("/usr/bin/chromium")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]

PROXY_USER, PROXY_PASSWORD = "proxyuser", "proxypw"
BASIC = "Basic " + base64.b64encode(f"{PROXY_USER}:{PROXY_PASSWORD}".encode()).decode()
#: Headers a browser, a proxy or a confused client may attach; none authenticates to the hub.
STRAY_HEADERS = (BASIC, "Negotiate YIIBhgYGKwYBBQUCoIIBejCCAXY=", "token bogus", "Bearer bogus")
SAFE = {"GET", "HEAD", "OPTIONS"}
API_MODULES = (admin, agent, allocations, approvals, operate, planning, reclaim, restart, users)

POOL_EXTRA = """\
  - name: h100-asked
    kind: gpu
    count: 1
    models: [H100-80GB]
    approval: required
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubEnv]:
    tmp = tmp_path_factory.mktemp("xsrf")
    pool = tmp / "pool.yaml"
    text = Path(data_path("demo-pool.yaml")).read_text()
    pool.write_text(text.replace("offers:\n", "offers:\n" + POOL_EXTRA, 1))
    env = HubEnv(
        tmp,
        f"sqlite:///{tmp}/pool.sqlite",
        pool,
        users=("alice", "admin"),
        service_args=(
            "--PoolService.reconcile_on_start=False",
            "--PoolService.reconcile_interval=0",
            "--PoolService.check_user_servers=False",
        ),
        extra_config=textwrap.dedent(
            """
            for role in c.JupyterHub.load_roles:
                if role["name"] == "user":
                    role["scopes"].append("access:services!service=gpupool")
            """
        )
        .replace("{", "{{")
        .replace("}", "}}"),
    )
    with env.running():
        yield env


class BasicAuthProxy:
    """A reverse proxy in front of the hub that demands HTTP Basic auth and passes every
    header on (``Authorization`` included, as nginx's ``auth_basic`` does); it records what it
    forwarded."""

    def __init__(self, upstream: str) -> None:
        target = urlsplit(upstream)
        self.forwarded: list[dict[str, Any]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if self.headers.get("Authorization") != BASIC:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="gpupool"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                proxy.forwarded.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "authorization": self.headers.get("Authorization"),
                        "cookie": self.headers.get("Cookie", ""),
                    }
                )
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
                conn.close()
                self.send_response(r.status)
                for name, value in r.getheaders():
                    if name.lower() not in ("connection", "transfer-encoding", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _any

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Attacker:
    """Pages on another origin, each an auto-submitting form (``/<n>``)."""

    def __init__(self) -> None:
        self.forms: list[str] = []
        attacker = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                form = attacker.forms[int(self.path.strip("/"))]
                body = (
                    "<!DOCTYPE html><title>Free cat pictures</title>"
                    f"{form}<script>document.forms[0].submit()</script>"
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def page(self, action: str, fields: dict[str, str], enctype: str) -> str:
        inputs = "".join(
            f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">'
            for k, v in fields.items()
        )
        self.forms.append(
            f'<form method="POST" action="{escape(action)}" enctype="{enctype}">{inputs}</form>'
        )
        return f"{self.url}/{len(self.forms) - 1}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def proxy(hub: HubEnv) -> Iterator[BasicAuthProxy]:
    running = BasicAuthProxy(hub.hub_url)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    site = Attacker()
    try:
        yield site
    finally:
        site.close()


def log_in(browser: Any, base: str, user: str, **context_args: Any) -> Page:
    """A context logged in to the hub at ``base`` and to the pool's pages (hub OAuth)."""
    context = browser.new_context(**context_args)
    context.set_default_timeout(30_000)
    page = context.new_page()
    page.on("dialog", lambda d: pytest.fail(f"a page opened a dialog: {d.message!r}"))
    page.goto(f"{base}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", "any password")
    page.click("#login_submit")
    page.wait_for_url(f"{base}/hub/**")
    r = page.goto(f"{base}/services/gpupool/")
    assert r is not None and r.status == 200, r and r.text()
    return page


def lease(hub: HubEnv, user: str, offer: str, server: str) -> dict:
    r = request(
        "POST",
        f"{hub.api}/allocations",
        hub.spawner_token,
        {"user": user, "server": server, "offer": offer, "reason": "a test"},
    )
    assert r.status == 201, r.body
    out = r.json()
    if out["state"] == "granted":
        r = request("POST", f"{hub.api}/allocations/{out['id']}/keepalive", hub.token(user))
        assert r.status == 200, r.body
        out = r.json()
    return out


def state_changing_routes() -> list[tuple[str, str]]:
    """Every (method, path pattern relative to the service prefix) that is not a read, from
    the very route tables the service is built from."""
    routes = []
    for module in API_MODULES:
        for pattern, handler in module.default_handlers:
            for method in sorted(handler.allowed_methods() - SAFE):
                routes.append((method, "api/v1/" + pattern))
    for entry in pages.default_handlers("/"):
        pattern, handler = entry[0], entry[1]
        methods = (
            set(handler.SUPPORTED_METHODS) if issubclass(handler, pages.base.PageHandler) else set()
        )
        for method in sorted(methods - SAFE):
            if getattr(handler, method.lower()) is not getattr(
                pages.base.PageHandler, method.lower()
            ):
                routes.append((method, pattern.lstrip("/")))
    return routes


def concrete(pattern: str, ids: dict[str, str]) -> list[str]:
    """The paths a pattern stands for here: path arguments filled with real objects (a
    lease, a node, a quota), each alternative of a ``(a|b|c)`` group once."""
    path = pattern
    path = path.replace("allocations/([^/]+)", f"allocations/{ids['lease']}")
    path = path.replace("reclaim/leases/([^/]+)", f"reclaim/leases/{ids['lease']}")
    path = path.replace("keep/([^/]+)", f"keep/{ids['lease']}")
    path = path.replace("quotas/([^/]+)/([^/]+)", "quotas/users/alice")
    path = path.replace("nodes/([^/]+)", "nodes/sim-t4")
    path = path.replace("repartitions/([^/]+)", "repartitions/1")
    assert "[^/]" not in path, f"no object for {pattern}: add one to concrete()"
    group = re.search(r"\(([^()]+)\)", path)
    if group is None:
        return [path]
    return [path[: group.start()] + alt + path[group.end() :] for alt in group[1].split("|")]


def snapshot(hub: HubEnv, admin_token: str, ids: dict[str, str]) -> dict[str, Any]:
    """What a forged request could have changed: the audit log, the node, the leases, the
    quota, the reclaim policies and the plans."""

    def get(path: str) -> Any:
        r = request("GET", f"{hub.api}/{path}", admin_token)
        assert r.status == 200, (path, r.body)
        return r.json()

    nodes = {n["name"]: n for c in get("pool")["clusters"] for n in c["nodes"]}
    return {
        "events": get("events?limit=1000")["total"],
        "node": (nodes["sim-t4"].get("cordoned"), nodes["sim-t4"].get("draining")),
        "leases": {key: get(f"allocations/{ids[key]}")["state"] for key in ("lease", "pending")},
        "quota": request("GET", f"{hub.api}/quotas/users/alice", admin_token).status,
        "policies": get("reclaim/policies"),
        "plans": get("repartitions"),
    }


def test_the_route_list_covers_the_service(hub: HubEnv) -> None:
    routes = state_changing_routes()
    # the list is not empty by accident: the known changes are in it
    assert ("POST", "api/v1/nodes/([^/]+)/(cordon|uncordon|drain)") in routes
    assert ("POST", "api/v1/allocations/([^/]+)/approve") in routes
    assert ("PUT", "api/v1/quotas/([^/]+)/([^/]+)") in routes
    assert ("POST", "keep/([^/]+)") in routes
    for method, pattern in routes:
        assert concrete(pattern, {"lease": "x"}), (method, pattern)
    # every API handler the service mounts comes from these modules
    mounted = {h for m in API_MODULES for _, h in m.default_handlers}
    assert all(issubclass(h, APIHandler) for h in mounted)


def test_a_stray_authorization_header_does_not_skip_xsrf(hub: HubEnv, browser: Any) -> None:
    admin_token = hub.token("admin")
    held = lease(hub, "alice", "t4-quarter", "held")
    pending = lease(hub, "alice", "h100-asked", "asked")
    assert pending["state"] == "awaiting_approval"
    ids = {"lease": held["id"], "pending": pending["id"]}
    page = log_in(browser, hub.hub_url, "admin")
    before = snapshot(hub, admin_token, ids)
    prefix = f"{hub.hub_url}{hub.service_prefix}"
    refused = []
    for method, pattern in state_changing_routes():
        for path in concrete(pattern, ids):
            for header in STRAY_HEADERS:
                r = page.context.request.fetch(
                    prefix + path,
                    method=method,
                    headers={"Authorization": header, "Content-Type": "application/json"},
                    data="{}",
                    max_redirects=0,
                )
                if path.startswith("api/"):
                    ok = r.status == 401 and r.json()["error"]["code"] == "unauthorized"
                else:  # a page form: refused (403), or sent to log in again; never kept
                    ok = r.status in (302, 403) and "kept=" not in r.headers.get("location", "")
                if not ok:
                    refused.append((method, path, header.split()[0], r.status, r.text()[:200]))
    assert refused == [], refused
    assert snapshot(hub, admin_token, ids) == before

    # the very same cookie passes with the page's XSRF token (Basic header or not) ...
    xsrf = page.get_attribute('meta[name="gpupool-xsrf"]', "content")
    for header in ({}, {"Authorization": BASIC}):
        r = page.context.request.get(
            prefix + "api/v1/users/me", headers={"X-XSRFToken": xsrf, **header}
        )
        assert r.status == 200 and r.json()["name"] == "admin", r.text()
    # ... and a real token with no XSRF token at all (token-authenticated: no XSRF check)
    r = page.context.request.post(
        prefix + "api/v1/nodes/sim-t4/cordon",
        headers={"Authorization": f"token {admin_token}", "Content-Type": "application/json"},
        data="{}",
    )
    assert r.status == 200, r.text()
    assert request("POST", f"{hub.api}/nodes/sim-t4/uncordon", admin_token, {}).status == 200
    page.context.close()
    for le in (held, pending):
        request("DELETE", f"{hub.api}/allocations/{le['id']}?reason=admin", hub.spawner_token)


def test_cross_site_forms_behind_a_basic_auth_proxy_change_nothing(
    hub: HubEnv, browser: Any, proxy: BasicAuthProxy, attacker: Attacker
) -> None:
    admin_token = hub.token("admin")
    held = lease(hub, "alice", "t4-quarter", "held-x")
    pending = lease(hub, "alice", "h100-asked", "asked-x")
    ids = {"lease": held["id"], "pending": pending["id"]}
    page = log_in(
        browser,
        proxy.url,
        "admin",
        http_credentials={"username": PROXY_USER, "password": PROXY_PASSWORD},
    )
    assert any(f["authorization"] == BASIC for f in proxy.forwarded)  # through the proxy
    before = snapshot(hub, admin_token, ids)
    api = f"{proxy.url}{hub.service_prefix}api/v1/"
    # JSON in a text/plain form: name '{"reason":"csrf' + '=' + value '"}' is valid JSON
    as_json = {"enctype": "text/plain", "fields": {'{"reason":"csrf': '"}'}}
    empty = {"enctype": "application/x-www-form-urlencoded", "fields": {}}
    attacks = [
        (api + "nodes/sim-t4/cordon", empty),
        (api + "nodes/sim-t4/drain", empty),
        (api + f"allocations/{pending['id']}/approve", empty),
        (api + f"allocations/{pending['id']}/deny", as_json),
        (api + f"allocations/{held['id']}/reclaim", as_json),
        (api + "quotas/users/alice", as_json),  # POST: not a route; 401 or 405, never a change
        (f"{proxy.url}{hub.service_prefix}keep/{held['id']}", empty),
    ]
    for action, form in attacks:
        url = attacker.page(action, form["fields"], form["enctype"])
        seen = len(proxy.forwarded)
        with page.expect_response(lambda r, a=action: r.url == a) as answer:
            page.goto(url)
        status = answer.value.status
        assert status in (401, 403, 405) or (
            status == 302 and "kept=" not in answer.value.headers.get("location", "")
        ), (action, status, answer.value.text()[:300])
        # the post did reach the pool with the admin's pool cookie and the Basic header
        posts = [f for f in proxy.forwarded[seen:] if f["method"] == "POST"]
        assert posts, f"the form to {action} never went through the proxy"
        assert all(f["authorization"] == BASIC for f in posts)
        assert all("service-gpupool" in f["cookie"] for f in posts), posts
    assert snapshot(hub, admin_token, ids) == before
    page.context.close()
    for le in (held, pending):
        request("DELETE", f"{hub.api}/allocations/{le['id']}?reason=admin", hub.spawner_token)


def test_the_pool_page_still_works_through_the_proxy(
    hub: HubEnv, browser: Any, proxy: BasicAuthProxy
) -> None:
    """The control: the admin's own panel, behind the same proxy, cordons for real."""
    admin_token = hub.token("admin")
    page = log_in(
        browser,
        proxy.url,
        "admin",
        http_credentials={"username": PROXY_USER, "password": PROXY_PASSWORD},
    )
    status = page.evaluate(
        """async () => {
            const api = document.querySelector('meta[name="gpupool-api"]').content;
            const xsrf = document.querySelector('meta[name="gpupool-xsrf"]').content;
            const r = await fetch(api + 'nodes/sim-t4/cordon', {method: "POST",
                credentials: "same-origin", body: "{}",
                headers: {"X-XSRFToken": xsrf, "Content-Type": "application/json"}});
            return r.status;
        }"""
    )
    assert status == 200
    pool = request("GET", f"{hub.api}/pool", admin_token).json()
    assert any(
        n["name"] == "sim-t4" and n["cordoned"] for c in pool["clusters"] for n in c["nodes"]
    )
    assert request("POST", f"{hub.api}/nodes/sim-t4/uncordon", admin_token, {}).status == 200
    page.context.close()
