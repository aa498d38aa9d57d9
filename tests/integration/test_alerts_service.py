"""The alerts through the real service behind a real hub: every metric the shipped rules name is
on its /metrics; a simulated GPU that falls off the bus raises GPUPoolGPUUnhealthy once, which
reaches the notify hook's webhook (a real HTTP receiver), the audit log, ``GET alerts`` and the
admin panel's banner, and resolves once when the GPU is back."""

from __future__ import annotations

import http.cookiejar
import json
import re
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import data_path
from tests.fakes import HubEnv, request, wait_reconciled, wait_until

ROOT = Path(__file__).resolve().parents[2]
RULES_FILE = ROOT / "helm" / "jupyterhub-gpupool" / "files" / "alerts.rules.yaml"


class Receiver(BaseHTTPRequestHandler):
    """A chat tool's incoming webhook: keeps every JSON body posted to it."""

    bodies: list[dict] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        type(self).bodies.append(json.loads(self.rfile.read(length)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict]]]:
    bodies: list[dict] = []
    handler = type("Hook", (Receiver,), {"bodies": bodies})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/hook", bodies
    server.shutdown()
    server.server_close()


@pytest.fixture
def env(tmp_path, sqlite_url, webhook, monkeypatch) -> Iterator[HubEnv]:
    """Hub and pool service on the demo pool's simulated GPUs (read in-process), alerts every
    second, the project's webhook hook posting to ``webhook``."""
    monkeypatch.setenv("GPUPOOL_RECLAIM_WEBHOOK", webhook[0])
    args = (
        "--PoolService.telemetry_source=sim",
        "--PoolService.sample_interval=0.5",
        "--PoolService.housekeeping_interval=1",
        "--PoolService.notify_hook=jupyterhub_gpupool.reclaim.hooks.webhook_from_env",
        "--PoolAlerts.interval=1",
    )
    pool = data_path("demo-pool.yaml")
    with HubEnv(tmp_path, sqlite_url, pool, service_args=args).running() as hub:
        wait_reconciled(hub)
        yield hub


def admin_page(env: HubEnv, path: str) -> str:
    """A pool page as the hub's admin sees it: logged in through the hub's login form
    (``next`` = the page, so the hub spawns nothing), then the service's OAuth."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    login = f"{env.hub_url}/hub/login?" + urllib.parse.urlencode(
        {"next": f"{env.service_prefix}{path}"}
    )
    opener.open(login, timeout=30).read()
    xsrf = next(c.value for c in jar if c.name == "_xsrf")
    form = urllib.parse.urlencode({"username": "admin", "password": "x", "_xsrf": xsrf})
    return opener.open(login, form.encode(), timeout=30).read().decode()


def rule_metrics() -> set[str]:
    exprs = [
        r["expr"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]
    ]
    return {m for e in exprs for m in re.findall(r"\bgpupool_[a-z0-9_]+", e)}


def test_every_metric_a_rule_names_is_on_metrics_and_a_lost_gpu_alerts(env, webhook):
    admin = env.token("admin")
    text = request("GET", env.api.replace("/api/v1", "/metrics"), admin).body.decode()
    # declared (HELP and TYPE; a labelled gauge has no sample before its first label set) or
    # sampled; a counter's samples end in _total
    families = list(text_string_to_metric_families(text))
    exported = {f.name for f in families} | {s.name for f in families for s in f.samples}
    named = rule_metrics()
    assert len(named) >= 10
    assert named <= exported, f"named by a rule, not exported: {sorted(named - exported)}"

    # a simulated GPU of the demo pool falls off the bus
    def nodes() -> dict:
        pool = request("GET", f"{env.api}/pool", admin).json()
        return {n["name"]: n for c in pool["clusters"] for n in c["nodes"]}

    node = wait_until(lambda: nodes().get("sim-h100"), what="the sim-h100 node", info=env.logs)
    gpu = node["gpus"][0]["uuid"]
    assert request("GET", f"{env.api}/alerts", admin).json() == {"items": [], "total": 0}
    url = f"{env.api}/nodes/sim-h100/gpus/{gpu}/simulated-fault"
    r = request("POST", url, admin, {"lost": True})
    assert r.status == 200, r.body
    assert not nodes()["sim-h100"]["gpus"][0]["healthy"]  # read again at once

    def active() -> list:
        return request("GET", f"{env.api}/alerts", admin).json()["items"]

    (alert,) = wait_until(active, what="the GPUPoolGPUUnhealthy alert", info=env.logs)
    assert alert["name"] == "GPUPoolGPUUnhealthy" and alert["severity"] == "critical"
    assert alert["subject"] == f"sim-h100/{gpu}" and alert["page"] == "nodes"
    # the admin panel shows it on every page, linking to the page of the cause
    html = admin_page(env, "admin/leases")
    banner = html[html.index('id="gpupool-alerts"') :]
    assert f"GPU sim-h100/{gpu} is unhealthy or lost" in banner
    assert f'href="{env.service_prefix}admin/nodes"' in banner
    # users see no banner, and may not list alerts
    assert request("GET", f"{env.api}/alerts", env.token("alice")).status == 403

    # back on the bus: resolved once
    assert request("POST", url, admin, {"lost": False}).status == 200
    wait_until(lambda: active() == [], what="the alert to resolve", info=env.logs)
    hooked = wait_until(
        lambda: len(webhook[1]) >= 2 and webhook[1], what="two webhook posts", info=env.logs
    )
    assert [b["event"] for b in hooked] == ["alert", "alert-resolved"]
    assert hooked[0]["decision"]["kind"] == "gpu_unhealthy"
    assert hooked[0]["text"].startswith("[critical] GPU sim-h100/")
    events = request("GET", f"{env.api}/events?kind=alert-raised", admin).json()["items"]
    assert [e["data"]["subject"] for e in events] == [f"sim-h100/{gpu}"]
    events = request("GET", f"{env.api}/events?kind=alert-resolved", admin).json()["items"]
    assert len(events) == 1

    # bad input: a clear error, nothing changed
    bad = request("POST", url, admin, {"lost": "yes"})
    assert bad.status == 422 and bad.json()["error"]["field"] == "lost"
    missing = request(
        "POST", f"{env.api}/nodes/sim-h100/gpus/GPU-none/simulated-fault", admin, {"lost": True}
    )
    assert missing.status == 404, missing.body
    other = request(
        "POST", f"{env.api}/nodes/elsewhere/gpus/{gpu}/simulated-fault", admin, {"lost": True}
    )
    assert other.status == 409 and other.json()["error"]["code"] == "conflict"
    assert request("POST", url, env.token("alice"), {"lost": True}).status == 403
    assert active() == []
