"""The pool service's user page at its prefix root (the hub's Services → gpupool link).

Against a real hub and pool service: the page needs a hub login (OAuth for browsers, a token
header works too), shows the caller's own leases by their offers' display names and the quota,
never another user's, and prints a hostile server name as text.
"""

from __future__ import annotations

import urllib.request
from email.message import Message
from pathlib import Path

import pytest

from tests.fakes import HubEnv, request, write_pool

HOSTILE = '<img src=x onerror="alert(1)">'
#: what the demo's hub config adds: users may open the service (hub OAuth checks this scope)
ACCESS = """
for role in c.JupyterHub.load_roles:
    if role["name"] == "user":
        role["scopes"].append("access:services!service=gpupool")
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    tmp: Path = tmp_path_factory.mktemp("userpage")
    env = HubEnv(
        tmp,
        f"sqlite:///{tmp}/pool.sqlite",
        write_pool(tmp),
        service_args=("--PoolService.reconcile_on_start=False",),
        extra_config=ACCESS.replace("{", "{{").replace("}", "}}"),
    )
    with env.running():
        yield env


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def get(url: str, token: str | None = None) -> tuple[int, Message, str]:
    """GET without following redirects; headers as sent (case-insensitive lookup)."""
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"token {token}")
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=30) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode(errors="replace")


def test_the_page_shows_my_leases_and_quota_escaped(hub):
    r = request(
        "POST",
        f"{hub.api}/allocations",
        hub.spawner_token,
        {"user": "alice", "server": HOSTILE, "offer": "t4-quarter"},
    )
    assert r.status == 201, r.body
    page = f"{hub.hub_url}/services/gpupool/"
    status, headers, html = get(page, hub.token("alice"))
    assert status == 200, html
    assert headers["Content-Type"].startswith("text/html")
    assert "¼ of a T4 (shared)" in html  # the offer's display name, not its id
    assert "Up to <strong>2 GPUs</strong> at a time" in html
    assert "1/4 GPU" in html
    assert HOSTILE not in html and "&lt;img src=x onerror=" in html
    assert 'href="/hub/token"' in html
    assert f"{hub.hub_url}/services/gpupool/api/v1/users/me" in html
    assert " UTC</td>" in html
    # bob sees his own (empty) page, not alice's lease
    status, _, html = get(page, hub.token("bob"))
    assert status == 200 and "You hold no GPU and wait for none" in html
    assert "T4" not in html.split("Your GPU leases")[1].split("The API")[0]


def test_a_browser_without_a_login_is_sent_to_the_hub(hub):
    status, headers, _ = get(f"{hub.hub_url}/services/gpupool/")
    assert status == 302
    assert "/hub/api/oauth2/authorize" in headers["Location"]
    # the hub's menu may link the prefix without its slash: the page's links need one
    status, headers, _ = get(f"{hub.hub_url}/services/gpupool", hub.token("alice"))
    assert status == 301 and headers["Location"] == "/services/gpupool/"
