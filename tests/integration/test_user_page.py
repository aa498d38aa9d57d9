"""The pool service's user page at its prefix root (the hub's Services → gpupool link).

Against a real hub and pool service: the page needs a hub login (OAuth for browsers, a token
header works too), shows the caller's own leases by their offers' display names and the quota,
never another user's, and prints a hostile server name as text; a reclaim notice with its
"Keep my GPU" button, and the reclaims of the week with the files saved.
"""

from __future__ import annotations

import json
import time
import urllib.request
from email.message import Message
from pathlib import Path

import pytest

from tests.fakes import ClockFile, HubEnv, clocked_service_python, request, write_pool

HOSTILE = '<img src=x onerror="alert(1)">'
#: what the demo's hub config adds: users may open the service (hub OAuth checks this scope)
ACCESS = """
for role in c.JupyterHub.load_roles:
    if role["name"] == "user":
        role["scopes"].append("access:services!service=gpupool")
"""


@pytest.fixture(scope="module")
def clock(tmp_path_factory: pytest.TempPathFactory) -> ClockFile:
    """The pool service's clock: it moves only when a test moves it (the reclaim rounds)."""
    return ClockFile(tmp_path_factory.mktemp("userpage-clock") / "clock", time.time())


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, clock: ClockFile):
    tmp: Path = tmp_path_factory.mktemp("userpage")
    env = HubEnv(
        tmp,
        f"sqlite:///{tmp}/pool.sqlite",
        write_pool(tmp),
        service_args=("--PoolService.reconcile_on_start=False", "--PoolService.decisions=thread"),
        extra_config=ACCESS.replace("{", "{{").replace("}", "}}"),
        python=clocked_service_python(clock),
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


#: Reclaim at once: notice at the first idle round, the action at the next; one extension.
AT_ONCE = {
    "idle_timeout": "1s",
    "pressure_idle_timeout": "1s",
    "cpu_busy_timeout": "1s",
    "warn_before": 0,
    "busy_grace": 0,
    "max_extensions": 1,
    "extension": "1s",
}


#: One reclaim window on the service's clock: the reclaimer's interval, longer than every
#: timeout and the extension of AT_ONCE, so one window is enough to pass each of them.
WINDOW = 30.0


def reclaim_round(hub: HubEnv, clock: ClockFile, lease: dict) -> str:
    """The next window of the service's clock (it moves on by WINDOW from where the last one
    ended, as a reclaimer's rounds follow each other), seeing the lease's GPU, kernel and user
    idle; one round over it, and its decision's kind."""
    admin = hub.token("admin")
    start = clock()
    clock.advance(WINDOW)
    now = clock()
    sample = {"gpu": lease["slots"][0]["gpu"], "ts": now - 1, "util": 0.0, "memory_used_mib": 9}
    r = request("POST", f"{hub.api}/nodes/sim-t4/samples", hub.agent_token, {"samples": [sample]})
    assert r.status == 200, r.body
    seen = {
        "kernel": {"state": "idle", "observed_at": now},
        "presence": {"last_input": None, "connections": 0, "observed_at": now},
    }
    body = {"holder": "page", "window": {"start": start, "end": now}, "observed": {}}
    body["observed"][lease["id"]] = seen
    r = request("POST", f"{hub.api}/reclaim/rounds", admin, body)
    assert r.status == 200, r.body
    return {d["lease"]: d["kind"] for d in r.json()["decisions"]}[lease["id"]]


def post(url: str, token: str) -> tuple[int, Message]:
    """POST a form without following the redirect."""
    req = urllib.request.Request(url, data=b"", method="POST")
    req.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=30) as r:
            return r.status, r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.headers


def test_the_page_shows_a_notice_keeps_the_gpu_and_lists_the_reclaim(hub, clock):
    admin, alice = hub.token("admin"), hub.token("alice")
    body = {"user": "alice", "server": "reclaimed", "offer": "t4-quarter"}
    lease = request("POST", f"{hub.api}/allocations", hub.spawner_token, body).json()
    assert request("POST", f"{hub.api}/allocations/{lease['id']}/keepalive", alice).status == 200
    r = request("PUT", f"{hub.api}/reclaim/policies", admin, {"default": AT_ONCE})
    assert r.status == 200, r.body
    page = f"{hub.hub_url}/services/gpupool/"
    try:
        lead = {"holder": "page", "ttl": 600}
        assert request("POST", f"{hub.api}/reclaim/leader", admin, lead).status == 200
        assert reclaim_round(hub, clock, lease) == "notice"
        status, _, html = get(page, alice)
        assert status == 200 and "Your GPU will be reclaimed at" in html, html
        assert "stop your server" in html and "Keep my GPU" in html
        assert f'action="/services/gpupool/keep/{lease["id"]}"' in html

        # bob cannot keep alice's GPU; alice can, once
        assert post(f"{page}keep/{lease['id']}", hub.token("bob"))[0] == 404
        status, headers = post(f"{page}keep/{lease['id']}", alice)
        assert status == 302 and headers["Location"].endswith(f"?kept={lease['id']}")
        status, _, html = get(page + f"?kept={lease['id']}", alice)
        assert "Kept: your GPU stays yours" in html and "Keep my GPU" not in html

        # a window later the extension is over: a new notice, which cannot be kept (the one
        # extension is used); at the next window, past its deadline, the action
        assert reclaim_round(hub, clock, lease) == "notice"
        status, _, html = get(page, alice)  # headed by its kind; no Keep, and why not
        assert "Idle GPU: it will be reclaimed" in html and "Keep my GPU" not in html
        # what the reclaim cannot save is said with the notice (issue 31)
        assert "edits in a tab you already closed without saving" in " ".join(html.split())
        assert "It cannot be kept: kept once already, the most allowed" in html
        status, headers = post(f"{page}keep/{lease['id']}", alice)
        assert status == 302 and headers["Location"].endswith("?refused=extension_limit")
        assert reclaim_round(hub, clock, lease) == "act"
        status, headers = post(f"{page}keep/{lease['id']}", alice)
        assert status == 302 and headers["Location"].endswith("?refused=reclaim_in_progress")
        outcome = {"holder": "page", "result": "done", "saved": ["<b>notes</b>.ipynb"]}
        path = f"{hub.api}/reclaim/leases/{lease['id']}/outcome"
        assert request("POST", path, admin, outcome).status == 200
        status, _, html = get(page, alice)
        recent = html.split("Recent reclaims")[1].split("The API")[0]
        assert "Stopped your server" in recent and "reclaimed" in recent
        assert "&lt;b&gt;notes&lt;/b&gt;.ipynb" in recent  # escaped, as every value
        assert "idle" in recent

        # a lab page whose server is gone asks the pool how the lease ended (pages/ended.py):
        # in words, and as JSON whose "<" cannot end its script element
        status, _, html = get(f"{page}ended/{lease['id']}", alice)
        assert status == 200, html
        raw = html.split('id="gpupool-lease-end">')[1].split("</script>")[0]
        assert "<" not in raw
        end = json.loads(raw)
        assert end["ended"] and end["reclaimed"] and end["kind"] == "idle"
        assert end["saved"] == ["<b>notes</b>.ipynb"] and end["action"] == "stop"
        assert end["reason"].startswith("the GPU has been idle for")
        assert end["offer_name"] == "¼ of a T4 (shared)" and end["at"]
        text = html.split('id="gpupool-lease-end-text"')[1].split("</p>")[0]
        assert "Your GPU was reclaimed at" in text and "because the GPU has been idle" in text
        assert "Stopped your server" in text and "&lt;b&gt;notes&lt;/b&gt;.ipynb" in text
        assert 'href="/hub/home"' in html
        # only the caller's own leases; a lease still held says so
        assert get(f"{page}ended/{lease['id']}", hub.token("bob"))[0] == 404
        assert get(f"{page}ended/no-such-lease", alice)[0] == 404
        body = {"user": "alice", "server": "held", "offer": "t4-quarter"}
        held = request("POST", f"{hub.api}/allocations", hub.spawner_token, body).json()
        status, _, html = get(f"{page}ended/{held['id']}", alice)
        assert status == 200 and "This lease is still yours" in html
        gone = request("DELETE", f"{hub.api}/allocations/{held['id']}", hub.spawner_token)
        assert gone.status < 300, gone.body
    finally:
        request("DELETE", f"{hub.api}/reclaim/policies", admin)
        request("DELETE", f"{hub.api}/reclaim/leader?holder=page", admin)
