"""The lab package in real Chromium: JupyterLab in a real single-user server, a real JupyterHub
and proxy, the pool service on a moved clock with simulated GPUs, and the reclaimer's core driven
round by round (the reclaim rig of ``tests/fakes/reclaim.py``).

The panel shows the right lease and numbers; an idle notice appears (status bar amber, the
countdown, the reason) and Keep my GPU clears it; the pool service stopped → the panel says so
and recovers without a reload; a move from a 1g.10gb slice to a 3g.40gb slice completes and the
new ``MIG-…`` UUID is in the server's environment; "My jobs" lists the user's jobs with their
output and cancels one. axe-core (WCAG 2 A/AA, contrast included)
finds nothing in the panel and the status bar, in the light and the dark theme; the controls are
reached with the keyboard. With ``GPUPOOL_SCREENSHOTS=docs/source/_static/screenshots`` the
tests save the user guide's pictures.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("playwright.sync_api")
pytest.importorskip("jupyterlab_gpupool", reason="make test installs ./labextension")

from playwright.sync_api import Page, expect

from tests.browser.conftest import run_first_cell
from tests.fakes import (
    LAB_POOL,
    ROOT,
    ClockFile,
    HubEnv,
    SimAgent,
    clocked_service_python,
    lab_hub,
    request,
    server_environ,
    start_server,
    user_server,
    wait_reconciled,
    wait_until,
)

CHROMIUM = Path("/usr/bin/chromium")
AXE = ROOT / ".node" / "node_modules" / "axe-core" / "axe.min.js"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.e2e,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]

POOL = (
    LAB_POOL
    + """quotas:
  default: {guarantee: 1, limit: 2, budget: 40, period: week}
reclaim:
  default: {idle_timeout: 5m, pressure_idle_timeout: 3m, warn_before: 2m, max_extensions: 2,
            extension: 5m,
            min_runtime: 3m, busy_grace: 2m, cpu_busy_timeout: 8m}
"""
)
NODES = ["node-a100", "node-h100"]
WINDOW, STEP = 60.0, 20.0
RECLAIMER = "gpupool-reclaimer"
VIEWPORT = {"width": 1280, "height": 820}
LAB_TIMEOUT = 120_000
#: the lab's news toast would cover the pictures
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": (
        '{"fetchNews": "false", "checkForUpdates": false}'
    ),
}


def hub_config(token: str) -> str:
    """The reclaimer's service and role (its documented scopes), JupyterLab by default, users
    allowed on the pool's pages."""
    scopes = [
        "list:users",
        "read:servers",
        "servers",
        "access:servers",
        "admin:server_state",
        "custom:gpupool:reclaim",
    ]
    service = repr({"name": RECLAIMER, "api_token": token})
    role = repr({"name": RECLAIMER, "services": [RECLAIMER], "scopes": scopes})
    text = (
        f"\nc.JupyterHub.services.append({service})\nc.JupyterHub.load_roles.append({role})\n"
        "c.Spawner.default_url = '/lab'\n"
        # as the documented hub config (hub-config.md): users may open the pool's pages, which
        # a lab whose server is gone asks how its lease ended
        "for role in c.JupyterHub.load_roles:\n"
        "    if role['name'] == 'user':\n"
        "        role['scopes'].append('access:services!service=gpupool')\n"
    )
    return text.replace("{", "{{").replace("}", "}}")


#: JupyterLab exposes its app object: the tests switch the theme with its command
EXPOSE_APP = "--LabApp.expose_app_in_browser=True"


@dataclass
class Lab:
    """The hub, the pool on its clock, the simulated GPUs and the reclaimer."""

    env: HubEnv
    clock: ClockFile
    agent: SimAgent
    reclaimer: Any

    def spawn(self, user: str, offer: str) -> None:
        start_server(self.env, user, offer)

    def server(self, user: str) -> dict:
        return user_server(self.env, user)

    def environ(self, user: str) -> dict[str, str]:
        return server_environ(self.env, user)

    def lease(self, lease_id: str) -> dict:
        r = request("GET", f"{self.env.api}/allocations/{lease_id}", self.env.spawner_token)
        return r.json()  # type: ignore[return-value]

    def round(self) -> dict[str, dict]:
        """One window of the clock with GPU samples, then one reclaimer round."""
        self.agent.run(WINDOW, STEP)
        # in a thread: Playwright's sync API holds this thread's event loop
        with ThreadPoolExecutor(1) as pool:
            result = pool.submit(asyncio.run, self.reclaimer.run_once()).result()
        assert result.result == "ok", result
        return {d["lease"]: d for d in result.decisions}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    from jupyterhub_gpupool.hubclient import HubClient
    from jupyterhub_gpupool.poolclient import PoolClient
    from jupyterhub_gpupool.reclaim.core import Reclaimer

    tmp = tmp_path_factory.mktemp("lab-ui")
    clock = ClockFile(tmp / "clock", time.time() + 60)
    token = secrets.token_hex(16)
    env = lab_hub(
        tmp,
        POOL,
        lab_args=(EXPOSE_APP,),
        extra_config=hub_config(token),
        service_args=(
            "--PoolService.decisions=thread",
            "--PoolService.agent_timeout=0",
            "--PoolService.reconcile_interval=0",
            "--PoolService.housekeeping_interval=1",
            "--PoolService.grant_timeout=86400",
        ),
        python=clocked_service_python(clock),
    )
    for user in ("alice", "bob"):
        for name, text in LAB_SETTINGS.items():
            path = tmp / "home" / user / ".jupyter/lab/user-settings" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    with env.running():
        wait_reconciled(env)
        agent = SimAgent(env, env.pool_config, NODES, clock)  # type: ignore[arg-type]
        agent.report_inventory()
        agent.run(WINDOW, STEP)
        reclaimer = Reclaimer(
            PoolClient(env.api, token),
            HubClient(env.hub_api, token, proxy_url=env.hub_url),
            holder="ui-tests",
            interval=WINDOW,
            clock=clock,
            poll_interval=0.2,
        )
        try:
            yield Lab(env, clock, agent, reclaimer)
        finally:
            for user in ("alice", "bob"):
                request("DELETE", f"{env.hub_api}/users/{user}/server", env.admin_api_token)
            print(env.logs())


@pytest.fixture(scope="module")
def alice(lab: Lab, browser: Any) -> Iterator[Page]:
    """alice on a 1g.10gb slice, logged in, in JupyterLab with the GPU panel open."""
    lab.spawn("alice", "a100-1g")
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    page = context.new_page()
    page.goto(f"{lab.env.hub_url}/hub/login")
    page.fill("#username_input", "alice")
    page.fill("#password_input", "any password")
    page.click("#login_submit")
    page.goto(f"{lab.env.hub_url}/user/alice/lab")
    page.locator("#jp-main-dock-panel").wait_for(timeout=LAB_TIMEOUT)
    status = page.locator(".jp-GPUPool-status-button")
    expect(status).to_contain_text("A100 1g.10gb", timeout=60_000)
    status.click()  # opens the panel
    expect(page.locator("#jp-gpupool-panel")).to_be_visible()
    try:
        yield page
    finally:
        context.close()


def theme(page: Page, name: str) -> None:
    """Switch JupyterLab's theme with its own command and wait until it applies."""
    page.evaluate(
        "name => window.jupyterapp.commands.execute('apputils:change-theme', {theme: name})",
        name,
    )
    light = "true" if "Light" in name else "false"
    page.wait_for_selector(f'body[data-jp-theme-light="{light}"]', state="attached", timeout=30_000)
    # the theme's CSS loads after the attribute changes: wait until the panel is painted in it
    page.wait_for_function(
        """dark => {
            const c = getComputedStyle(document.querySelector('#jp-gpupool-panel')).backgroundColor;
            const [r, g, b] = c.match(/\\d+/g).map(Number);
            return (r + g + b) / 3 < 128 === dark;
        }""",
        arg=light == "false",
        timeout=30_000,
    )
    # JupyterLab covers the page with its splash while a theme loads
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=30_000)


def axe(page: Page) -> list[dict]:
    """axe-core's WCAG 2 A/AA violations in the panel and the status bar item (and contrast it
    could not decide). JupyterLab's body has no height (its shell is positioned absolutely),
    which axe reads as every element clipped away: it is given the window's height first, and
    the contrast of at least some text must have been checked, so the check cannot pass empty.
    """
    if not AXE.exists():
        pytest.fail(f"no {AXE}: `make test` installs axe-core (npm)")
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    result = page.evaluate(
        """async () => {
            document.documentElement.style.height = '100%';
            document.body.style.height = '100%';
            const r = await axe.run(
                {include: [['#jp-gpupool-panel'], ['.jp-GPUPool-status']]},
                {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21aa']}});
            const unsure = r.incomplete.filter(v => v.id === 'color-contrast');
            const checked = r.passes.filter(v => v.id === 'color-contrast')
                .reduce((n, v) => n + v.nodes.length, 0);
            return {checked, problems: [...r.violations, ...unsure].map(v => ({id: v.id,
                help: v.help,
                nodes: v.nodes.map(n => n.target.join(' ') + ': ' + n.failureSummary)}))};
        }"""
    )
    assert result["checked"] >= 10, f"axe checked the contrast of {result['checked']} elements"
    return result["problems"]


def shot(shoot: Any, page: Page, name: str) -> None:
    """The panel and the status bar (the whole window: where the panel sits matters)."""
    shoot(page, name)


def panel(page: Page):
    return page.locator("#jp-gpupool-panel")


def test_the_panel_shows_the_lease_and_the_numbers(lab: Lab, alice: Page, shoot: Any):
    env = lab.environ("alice")
    lease = lab.lease(env["GPUPOOL_LEASE_ID"])
    # a process holds 3 GiB of the slice for a few windows: the memory chart has a shape
    machine = lab.agent.machines["node-a100"]
    pid = machine.add_process(env["CUDA_VISIBLE_DEVICES"], 3072)
    try:
        for _ in range(3):
            lab.agent.run(WINDOW, STEP)
    finally:
        machine.remove_process(pid)
    lab.agent.run(WINDOW, STEP)
    p = panel(alice)
    expect(p.locator("svg[role=img]").last).to_have_attribute(
        "aria-label", re.compile(r"highest 3(\.\d)? GiB"), timeout=30_000
    )
    expect(p).to_contain_text("A100 1g.10gb")
    expect(p).to_contain_text("A100 · 1g.10gb slice (a100-1g)")
    expect(p).to_contain_text(env["CUDA_VISIBLE_DEVICES"])  # the MIG-… device
    expect(p).to_contain_text(lease["slots"][0]["gpu"])  # its parent GPU
    expect(p).to_contain_text("node-a100")
    expect(p).to_contain_text("0.14 in use · guarantee 1 · limit 2")
    expect(p).to_contain_text("of 40")
    expect(p).to_contain_text("1× H100 80GB")  # a move choice, with its cost and fit
    expect(p).to_contain_text("1 unit · 1 free now · fits your quota")
    expect(p).to_contain_text("NVML")  # no NVML on this server: said plainly
    memory = p.locator("svg[role=img]").last
    expect(memory).to_have_attribute("aria-label", re.compile("GPU memory used"))
    bar = alice.locator(".jp-GPUPool-status-button")
    expect(bar).to_contain_text("A100 1g.10gb")
    expect(bar).to_have_attribute("aria-label", re.compile(r"^GPU: A100 1g\.10gb"))
    assert axe(alice) == []
    shot(shoot, alice, "lab-panel-light")
    theme(alice, "JupyterLab Dark")
    try:
        assert axe(alice) == []
        shot(shoot, alice, "lab-panel-dark")
    finally:
        theme(alice, "JupyterLab Light")


def test_my_jobs_in_the_panel_with_their_output_and_cancel(lab: Lab, alice: Page, shoot: Any):
    """Alice's jobs in her lab's panel: a running training job with its output, one waiting
    behind it for the only H100 (its place in line), which she cancels from the panel."""
    env = lab.env
    token = env.user_tokens.setdefault("alice", env.token("alice"))

    def submit(name: str) -> dict:
        body = {"offer": "h100", "class": "training", "name": name, "command": ["python"]}
        r = request("POST", f"{env.api}/jobs", token, body)
        assert r.status == 201, r.body
        return r.json()  # type: ignore[return-value]

    def runner(path: str, body: dict) -> None:
        r = request("POST", f"{env.api}/jobs/{path}", env.agent_token, body)
        assert r.status == 200, r.body

    running, waiting = submit("resnet"), submit("sweep")
    assert waiting["state"] == "queued", waiting
    try:
        runner(f"{running['id']}/status", {"state": "running", "pid": 4242})
        output = "epoch 1/10 loss 2.31\nepoch 2/10 loss 1.87\n"
        runner(f"{running['id']}/logs", {"offset": 0, "data": output})
        jobs = panel(alice).locator(".jp-GPUPool-jobs")
        row = jobs.locator(f'li[data-job="{running["id"]}"]')
        expect(row.locator(".jp-GPUPool-jobState")).to_have_text(
            "running on node-h100", timeout=30_000
        )  # the panel asks for the jobs every 10 s
        expect(row.locator(".jp-GPUPool-jobClass")).to_have_text("training")
        queued = jobs.locator(f'li[data-job="{waiting["id"]}"]')
        expect(queued.locator(".jp-GPUPool-jobState")).to_have_text("queued, 1st in line")
        # the panel scrolled to its top (a click scrolls it; axe cannot judge text scrolled under)
        alice.evaluate("document.getElementById('jp-gpupool-panel').scrollTop = 0")
        assert axe(alice) == []
        row.get_by_role("button", name="Output of resnet").click()
        expect(jobs.locator(".jp-GPUPool-jobLogText")).to_have_text(output)
        jobs.scroll_into_view_if_needed()
        shot(shoot, alice, "lab-jobs")
        queued.get_by_role("button", name="Cancel sweep").click()
        expect(jobs.locator(".jp-GPUPool-jobMessage")).to_have_text(
            "sweep: cancelled (by user:alice)."
        )
        expect(queued).to_have_attribute("data-state", "cancelled")
        expect(queued.get_by_role("button", name="Cancel sweep")).to_have_count(0)
        r = request("GET", f"{env.api}/allocations/{waiting['lease_id']}", env.spawner_token)
        assert r.json()["state"] == "released"  # type: ignore[index]
        jobs.get_by_role("button", name="Close output").click()
        expect(jobs.locator(".jp-GPUPool-jobLog")).to_be_hidden()
    finally:
        # the next tests judge the panel from its top (axe cannot judge text scrolled under)
        alice.evaluate("document.getElementById('jp-gpupool-panel').scrollTop = 0")
        for j in (running, waiting):
            request("DELETE", f"{env.api}/jobs/{j['id']}", token)
        # the running one is stopped by its runner: its exit ends it and frees the H100
        request("POST", f"{env.api}/jobs/{running['id']}/status", env.agent_token,
                {"state": "exited", "exit_code": -15})  # fmt: skip


def test_the_idle_notice_appears_and_keep_my_gpu_clears_it(lab: Lab, alice: Page, shoot: Any):
    lease_id = lab.environ("alice")["GPUPOOL_LEASE_ID"]
    for _ in range(12):
        if lab.round()[lease_id]["kind"] == "notice":
            break
    else:
        raise AssertionError("no idle notice in 12 windows")
    p = panel(alice)
    expect(p.locator(".jp-GPUPool-notice")).to_be_visible(timeout=30_000)
    expect(p).to_contain_text("This GPU will be reclaimed in")
    expect(p).to_contain_text("your server will be stopped")
    expect(alice.locator(".jp-GPUPool-status")).to_have_class(re.compile("jp-GPUPool-amber"))
    assert axe(alice) == []
    shot(shoot, alice, "lab-notice-light")
    theme(alice, "JupyterLab Dark")
    try:
        assert axe(alice) == []
        shot(shoot, alice, "lab-notice-dark")
    finally:
        theme(alice, "JupyterLab Light")
    # Keep my GPU with the keyboard: Tab from the panel's heading reaches it, Enter presses it
    p.locator(".jp-GPUPool-heading").evaluate("h => { h.tabIndex = -1; h.focus(); }")
    for _ in range(40):
        alice.keyboard.press("Tab")
        if alice.evaluate("document.activeElement && document.activeElement.id") == (
            "jp-gpupool-keep"
        ):
            break
    else:
        raise AssertionError("Keep my GPU is not reached with Tab")
    alice.keyboard.press("Enter")
    expect(p.locator(".jp-GPUPool-notice")).to_have_count(0, timeout=30_000)
    expect(p).to_contain_text("Kept: your GPU stays yours.")
    expect(alice.locator(".jp-GPUPool-status")).not_to_have_class(re.compile("jp-GPUPool-amber"))
    lease = lab.lease(lease_id)
    assert lease["state"] == "active" and lease["reclaim"] is None


def test_the_pool_away_is_said_and_the_panel_recovers_without_a_reload(lab: Lab, alice: Page):
    alice.evaluate("window.__sameTab = true")
    p = panel(alice)
    lab.env.kill_service()
    try:
        expect(p).to_contain_text("The GPU pool is not answering", timeout=60_000)
        expect(p).to_contain_text("Showing what it last said")
        expect(alice.locator(".jp-GPUPool-status")).to_have_attribute("data-tone", "down")
    finally:
        lab.env.start_service()
    expect(p).not_to_contain_text("The GPU pool is not answering", timeout=60_000)
    expect(p).to_contain_text("A100 1g.10gb")
    assert alice.evaluate("window.__sameTab") is True  # no reload


#: Notes each text the status bar shows (every 50 ms, across the move's reload) in the tab's
#: sessionStorage: a "CPU only" there for a moment would be a flash the user sees.
BAR_LOG = """(() => setInterval(() => {
    const b = document.querySelector('.jp-GPUPool-status-button');
    if (!b) { return; }
    const log = JSON.parse(sessionStorage.getItem('bar-log') || '[]');
    if (log[log.length - 1] !== b.textContent) {
        log.push(b.textContent);
        sessionStorage.setItem('bar-log', JSON.stringify(log));
    }
}, 50))()"""


def stale_widget_notebook(lab: Lab, name: str) -> None:
    """A notebook whose output shows a widget of a kernel that is gone (as one saved before a
    move holds): JupyterLab would say "Error displaying widget: model not found"."""
    view = {"model_id": "5f0e4b1c2d3a49e8b7c6d5e4f3a2b1c0", "version_major": 2, "version_minor": 0}
    output = {
        "output_type": "display_data",
        "data": {"application/vnd.jupyter.widget-view+json": view, "text/plain": "GPUPoolWidget()"},
        "metadata": {},
    }
    cell = {
        "cell_type": "code",
        "execution_count": 1,
        "id": "w",
        "metadata": {},
        "outputs": [output],
        "source": "GPUPoolWidget()",
    }
    kernel = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb = {"cells": [cell], "metadata": {"kernelspec": kernel}, "nbformat": 4, "nbformat_minor": 5}
    url = f"{lab.env.hub_url}/user/alice/api/contents/{name}"
    r = request("PUT", url, lab.env.token("alice"), {"type": "notebook", "content": nb})
    assert r.status in (200, 201), r.body


def test_a_move_from_1g_to_3g_restarts_onto_the_new_slice(lab: Lab, alice: Page, shoot: Any):
    """The page follows the new server as soon as it answers (not a reconnect back-off), the
    status bar stays on the old GPU until then (never "CPU only"), and a widget output of the
    old kernel says to run the cell again instead of "Error displaying widget"."""
    before = lab.environ("alice")
    stale_widget_notebook(lab, "stale.ipynb")
    alice.goto(f"{lab.env.hub_url}/user/alice/lab/tree/stale.ipynb")
    expect(alice.locator(".jp-Notebook .jp-Cell")).to_have_count(1, timeout=LAB_TIMEOUT)
    # the notebook is open on its kernel, as a user's is: JupyterLab writes the kernel's
    # language_info into it (an edit of JupyterLab's, saved by the move's "Save and restart"),
    # so after the move the only change is the lab's display fix, which must not dirty it
    idle = alice.get_by_role("button", name=re.compile(r"Python 3 \(ipykernel\) \| Idle"))
    expect(idle).to_be_visible(timeout=LAB_TIMEOUT)
    alice.context.add_init_script(BAR_LOG)
    alice.evaluate(f"() => {{ sessionStorage.removeItem('bar-log'); {BAR_LOG}; }}")
    bar = alice.locator(".jp-GPUPool-status-button")
    expect(bar).to_contain_text("A100 1g.10gb", timeout=60_000)
    if not panel(alice).is_visible():
        bar.click()
    p = panel(alice)
    choice = p.locator("#jp-gpupool-offer-a100-3g")
    choice.focus()
    alice.keyboard.press("Space")  # radios are chosen with the keyboard
    expect(choice).to_be_checked()
    p.locator("#jp-gpupool-move-go").click()
    dialog = alice.locator(".jp-Dialog")
    expect(dialog).to_contain_text("running kernels restart")
    shot(shoot, alice, "lab-move-dialog")
    dialog.get_by_role("button", name="Save and restart").click()

    def moved() -> dict | None:
        s = lab.server("alice")
        if not s.get("ready"):
            return None
        env = lab.environ("alice")
        return env if env["GPUPOOL_LEASE_ID"] != before["GPUPOOL_LEASE_ID"] else None

    after = wait_until(moved, 180, "alice's server on the 3g slice", info=lab.env.logs)
    ready = time.monotonic()
    assert after["GPUPOOL_OFFER"] == "a100-3g"
    assert after["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    assert after["CUDA_VISIBLE_DEVICES"] != before["CUDA_VISIBLE_DEVICES"]
    # the page reconnects by itself and the status bar shows the new device
    expect(bar).to_contain_text("A100 3g.40gb", timeout=LAB_TIMEOUT)
    print(f"the page showed the new GPU {time.monotonic() - ready:.1f} s after the hub said ready")
    shown = alice.evaluate("JSON.parse(sessionStorage.getItem('bar-log') || '[]')")
    assert shown[0] == "GPU: A100 1g.10gb" or shown[0].startswith("GPU: A100 1g.10gb ·"), shown
    assert not [t for t in shown if "CPU only" in t], shown  # no flash of "CPU only"
    # the old kernel's widget: a line saying to run the cell again, not an error
    outputs = alice.locator(".jp-Notebook .jp-OutputArea-output")
    expect(outputs).to_contain_text("belonged to the kernel before the move", timeout=60_000)
    expect(outputs).not_to_contain_text("Error displaying widget")
    expect(alice.locator(".jp-mod-dirty")).to_have_count(0)  # a display fix, not an edit
    bar.click()  # the new page: open the panel again
    expect(panel(alice)).to_contain_text(after["CUDA_VISIBLE_DEVICES"], timeout=60_000)
    expect(panel(alice)).to_contain_text("Now on A100 3g.40gb")
    assert lab.lease(before["GPUPOOL_LEASE_ID"])["state"] == "released"
    assert lab.lease(after["GPUPOOL_LEASE_ID"])["state"] == "active"
    assert axe(alice) == []
    shot(shoot, alice, "lab-after-move")
    # the next tests start without the notebook (a reclaim would save what its kernel changed)
    alice.evaluate("window.jupyterapp.commands.execute('application:close-all')")
    expect(alice.locator(".jp-Notebook")).to_have_count(0, timeout=60_000)  # a loaded CI box
    url = f"{lab.env.hub_url}/user/alice/api/contents/stale.ipynb"
    assert request("DELETE", url, lab.env.token("alice")).status == 204


def test_a_reclaim_saves_what_the_lab_holds_and_the_next_server_says_so(lab: Lab, alice: Page):
    """An edit only the browser holds is saved by the lab when the reclaimer calls save-all
    (the frontend's own save), and the panel of the next server lists the reclaim and the file."""
    token = lab.env.token("alice")
    base = f"{lab.env.hub_url}/user/alice"
    body = {"type": "file", "format": "text", "content": "written on disk\n"}
    assert request("PUT", f"{base}/api/contents/notes.txt", token, body).status in (200, 201)
    alice.goto(f"{base}/lab/tree/notes.txt")
    editor = alice.locator(".jp-FileEditor .cm-content")
    expect(editor).to_contain_text("written on disk", timeout=LAB_TIMEOUT)
    editor.click()
    alice.keyboard.press("Control+End")
    alice.keyboard.type("typed in the lab, never saved by hand\n")
    expect(alice.locator(".jp-mod-dirty")).not_to_have_count(0)
    lease_id = lab.environ("alice")["GPUPOOL_LEASE_ID"]
    for _ in range(20):
        decision = lab.round().get(lease_id, {})
        if decision.get("kind") == "act":
            break
    else:
        raise AssertionError("the reclaimer never acted on the idle lease")
    home = lab.env.dir / "home" / "alice"
    assert "typed in the lab" in (home / "notes.txt").read_text()
    wait_until(lambda: not lab.server("alice"), 120, "alice's server to stop")
    (reclaim,) = [
        r
        for r in request("GET", f"{lab.env.api}/users/me", token).json()["reclaims"]  # type: ignore[index]
        if r["lease"] == lease_id
    ]
    assert reclaim["saved"] == ["notes.txt"] and reclaim["outcome"] == "done"
    lab.spawn("alice", "a100-1g")
    alice.goto(f"{base}/lab")
    bar = alice.locator(".jp-GPUPool-status-button")
    expect(bar).to_contain_text("A100 1g.10gb", timeout=LAB_TIMEOUT)
    bar.click()
    recent = panel(alice).locator(".jp-GPUPool-reclaims")
    expect(recent).to_contain_text("A100 · 3g.40gb slice was reclaimed", timeout=30_000)
    expect(recent).to_contain_text("the server was stopped. Saved: notes.txt.")


def test_the_widget_shows_the_same_inside_a_notebook(lab: Lab, alice: Page, shoot: Any):
    token = lab.env.token("alice")
    base = f"{lab.env.hub_url}/user/alice"
    cell = {
        "cell_type": "code",
        "execution_count": None,
        "id": "w",
        "metadata": {},
        "outputs": [],
        "source": "from jupyterlab_gpupool import GPUPoolWidget\nGPUPoolWidget()",
    }
    kernel = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb = {"cells": [cell], "metadata": {"kernelspec": kernel}, "nbformat": 4, "nbformat_minor": 5}
    body = {"type": "notebook", "content": nb}
    assert request("PUT", f"{base}/api/contents/gpu.ipynb", token, body).status in (200, 201)
    alice.goto(f"{base}/lab/tree/gpu.ipynb")
    expect(alice.locator(".jp-Notebook .jp-Cell")).to_have_count(1, timeout=LAB_TIMEOUT)
    idle = alice.get_by_role("button", name=re.compile(r"Python 3 \(ipykernel\) \| Idle"))
    expect(idle).to_be_visible(timeout=60_000)
    output = alice.locator(".jp-OutputArea-output .widget-html-content").first
    run_first_cell(alice, "A100 1g.10gb", output)
    widget = alice.locator(".jp-OutputArea-output").first
    expect(widget).to_contain_text("GPU units in use")
    expect(widget.locator("meter")).not_to_have_count(0)
    shot(shoot, alice, "lab-widget")


# -- every notice kind, end to end: the notice in Lab, then what Lab says once it acted ------

#: Each kind the test gives bob's H100 lease: its heading in Lab, and whether it may be kept.
KINDS = {
    "idle": ("Idle GPU: it will be reclaimed", True),
    "max_age": ("Maximum age reached: this GPU will be reclaimed", False),
    "drain": ("Node maintenance: this GPU's node is being drained", False),
    "budget": ("Budget spent: this GPU will be reclaimed", False),
    "borrowed": ("Borrowed GPU: someone within their guarantee needs it", False),
    "exception": ("Your approved extra time ends", False),
}
#: What a test changed in the module's pool, to put back: an admin's call, or a function.
Undo = list[tuple[str, str] | Callable[[], object]]
#: The module's reclaim policy (POOL's), with a maximum age for the max_age kind.
POLICY = {
    "idle_timeout": "5m",
    "pressure_idle_timeout": "3m",
    "warn_before": "2m",
    "max_extensions": 2,
    "extension": "5m",
    "min_runtime": "3m",
    "busy_grace": "2m",
    "cpu_busy_timeout": "8m",
}


def open_lab(lab: Lab, browser: Any, user: str, device: str) -> Page:
    """``user`` logged in, in JupyterLab, the status bar on ``device``, the panel open."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    page = context.new_page()
    page.goto(f"{lab.env.hub_url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", "any password")
    page.click("#login_submit")
    page.goto(f"{lab.env.hub_url}/user/{user}/lab")
    page.locator("#jp-main-dock-panel").wait_for(timeout=LAB_TIMEOUT)
    status = page.locator(".jp-GPUPool-status-button")
    expect(status).to_contain_text(device, timeout=60_000)
    status.click()
    expect(panel(page)).to_be_visible()
    return page


def spawn_on_an_exception(lab: Lab) -> Undo:
    """bob asks for the H100 beyond his quota's limit on the spawn form (a reason, 0.1 h), an
    administrator approves it through the pool's API, and the same spawn goes on."""
    admin, api = lab.env.token("admin"), lab.env.api
    quota = {"guarantee": 0.5, "limit": 0.5, "exception": 1, "budget": 40, "period": "week"}
    assert request("PUT", f"{api}/quotas/users/bob", admin, quota).status == 200
    undo: Undo = [("DELETE", f"{api}/quotas/users/bob")]
    form = {
        "gpupool_offer": "h100",
        "gpupool_reason": "a paper deadline",
        "gpupool_duration_hours": "0.1",
    }
    r = request("POST", f"{lab.env.hub_api}/users/bob/server", lab.env.admin_api_token, form)
    assert r.status == 202, r.body

    def asked() -> list[dict]:
        r = request("GET", f"{api}/allocations?state=awaiting_approval", admin)
        return [a for a in r.json()["items"] if a["user"] == "bob"]  # type: ignore[index]

    (ask,) = wait_until(asked, 60, "bob's ask for an exception", info=lab.env.logs)
    r = request("POST", f"{api}/allocations/{ask['id']}/approve", admin, {})
    assert r.status == 200, r.body
    wait_until(lambda: lab.server("bob").get("ready"), 120, "bob's server", info=lab.env.logs)
    lease = lab.lease(ask["id"])
    assert lease["exception"] is True and lease["lapses"], lease
    return undo


def give_notice(lab: Lab, kind: str, lease_id: str) -> Undo:
    """Give bob's lease a notice of ``kind`` the way it comes in a pool (the reclaimer's
    rounds, an admin's drain, a spent budget, a waiter within guarantee, the approved time
    running out); what undoes the setting afterwards."""
    admin = lab.env.token("admin")
    api = lab.env.api
    undo: Undo = []
    if kind == "max_age":
        body = {"default": {**POLICY, "max_age": "4m"}}
        assert request("PUT", f"{api}/reclaim/policies", admin, body).status == 200
        undo.append(("DELETE", f"{api}/reclaim/policies"))
    elif kind == "drain":
        deadline = datetime.fromtimestamp(lab.clock() + 120, timezone.utc)
        body = {"deadline": deadline.strftime("%Y-%m-%dT%H:%M:%SZ")}
        r = request("POST", f"{api}/nodes/node-h100/drain", admin, body)
        assert r.status == 200 and r.json()["noticed"] == 1, r.body  # type: ignore[index]
        undo.append(("POST", f"{api}/nodes/node-h100/uncordon"))
    elif kind == "budget":
        quota = {"guarantee": 1, "limit": 2, "budget": 0.01, "period": "week"}
        body = {**quota, "budget_action": "stop"}
        assert request("PUT", f"{api}/quotas/users/bob", admin, body).status == 200
        undo.append(("DELETE", f"{api}/quotas/users/bob"))
    elif kind == "borrowed":
        undo += borrow_bobs_gpu_for_alice(lab)
    elif kind == "exception":  # at work: the idle notice (3 min idle) would come first
        undo.append(bobs_gpu_at_work(lab))
    due = None  # when the service's housekeeping (every second) gives the notice
    if kind == "exception":  # warn_before (POLICY's 2 min) ahead of the approved time's end
        lapses = lab.lease(lease_id)["lapses"].replace("Z", "+00:00")
        due = datetime.fromisoformat(lapses).timestamp() - 120
    for _ in range(12):
        reclaim = lab.lease(lease_id).get("reclaim")
        if reclaim:
            break
        lab.round()  # the clock moves: idle and age count, the budget is spent
        if kind == "budget" or (due is not None and lab.clock() >= due):
            wait_until(lambda: lab.lease(lease_id).get("reclaim"), 30, f"the {kind} notice")
    assert reclaim and reclaim["kind"] == kind, reclaim
    return undo


def bobs_gpu_at_work(lab: Lab) -> Callable[[], object]:
    """bob's simulated H100 busy (80 %) from now on; the function that makes it idle again."""
    machine = lab.agent.machines["node-h100"]
    gpu = lab.environ("bob")["CUDA_VISIBLE_DEVICES"]
    machine.set_load(gpu, {"pattern": "steady", "level": 80})
    return lambda: machine.set_load(gpu, "idle")


def borrow_bobs_gpu_for_alice(lab: Lab) -> Undo:
    """bob's H100 beyond his guarantee (0: the quota change makes the running lease borrowed),
    alice waiting for an H100 within hers. A borrowed GPU at work is taken back only where the
    admin allows it (``reclaim_busy_borrowed``), and this module's 3-minute pressure timeout
    would give an idle GPU the idle notice first (tests/unit/test_store_reclaim.py shows both):
    so the policy allows it and bob's GPU works, and the notice comes once the lease ran
    ``min_runtime``."""
    admin, api = lab.env.token("admin"), lab.env.api
    undo: Undo = []
    body = {"default": {**POLICY, "reclaim_busy_borrowed": True}}
    assert request("PUT", f"{api}/reclaim/policies", admin, body).status == 200
    undo.append(("DELETE", f"{api}/reclaim/policies"))
    quotas = {"bob": 0, "alice": 2}  # alice within guarantee, whatever else she holds
    for user, guarantee in quotas.items():
        quota = {"guarantee": guarantee, "limit": 3, "budget": 40, "period": "week"}
        assert request("PUT", f"{api}/quotas/users/{user}", admin, quota).status == 200
        undo.append(("DELETE", f"{api}/quotas/users/{user}"))
    undo.append(bobs_gpu_at_work(lab))
    ask = {"user": "alice", "server": "train", "offer": "h100"}
    r = request("POST", f"{api}/allocations", lab.env.spawner_token, ask)
    assert r.status == 201 and r.json()["state"] == "queued", r.body  # type: ignore[index]
    url = f"{api}/allocations/{r.json()['id']}"  # type: ignore[index]
    undo.append(lambda: request("DELETE", url, lab.env.spawner_token))
    return undo


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_notice_kind_is_said_in_lab_and_after_the_reclaim_lab_says_what_happened(
    lab: Lab, browser: Any, shoot: Any, kind: str
):
    heading, keep = KINDS[kind]
    undo: Undo = []
    page: Page | None = None
    try:
        if kind == "exception":
            undo += spawn_on_an_exception(lab)
        else:
            lab.spawn("bob", "h100")
        lease_id = lab.environ("bob")["GPUPOOL_LEASE_ID"]
        page = open_lab(lab, browser, "bob", "H100")
        undo += give_notice(lab, kind, lease_id)
        notice = panel(page).locator(".jp-GPUPool-notice")
        expect(notice).to_contain_text(heading, timeout=30_000)
        expect(notice).to_contain_text("This GPU will be reclaimed in")
        expect(notice).to_contain_text("closed without saving lived only in that browser")
        expect(page.locator(".jp-GPUPool-status")).to_have_class(re.compile("jp-GPUPool-amber"))
        if keep:
            expect(notice.locator("#jp-gpupool-keep")).to_be_enabled()
        else:  # no Keep button, the reason why not
            expect(notice.locator("#jp-gpupool-keep")).to_have_count(0)
            expect(notice).to_contain_text("It cannot be kept:")
        shot(shoot, page, f"lab-notice-{kind.replace('_', '-')}")
        reason = lab.lease(lease_id)["reclaim"]["reason"]
        if kind == "borrowed":  # the offer's name as users read it, not its id
            assert reason.endswith("alice (within guarantee) waits for 1× H100 80GB"), reason
        if kind == "exception":  # to the second, as people read it
            assert re.fullmatch(r"the approved time .* ends at \S+T\d\d:\d\d:\d\dZ", reason), reason
        for _ in range(12):
            if lab.round().get(lease_id, {}).get("kind") == "act":
                break
        else:
            raise AssertionError(f"the reclaimer never acted on the {kind} notice")
        wait_until(lambda: not lab.server("bob"), 120, "bob's server to stop")
        # the page outlives its server: the panel opens by itself and says, in the pool's
        # words (its record of the reclaim), what happened and the way back; no countdown
        said = panel(page).locator(".jp-GPUPool-reclaimed")
        expect(said).to_have_attribute("data-source", "pool", timeout=60_000)
        expect(said).to_contain_text(re.compile(r"Your GPU was reclaimed at \d\d:\d\d because"))
        expect(said).to_contain_text(reason)
        expect(said).to_contain_text("the server was stopped; nothing needed saving")
        expect(panel(page).locator(".jp-GPUPool-countdown")).to_have_count(0)
        expect(panel(page).locator("#jp-gpupool-keep")).to_have_count(0)
        home = panel(page).get_by_role("link", name="Hub home")
        expect(home).to_have_attribute("href", "/hub/home")
        bar = page.locator(".jp-GPUPool-status-button")
        expect(bar).to_have_text("GPU: reclaimed")
        expect(page.locator(".jp-GPUPool-status")).to_have_attribute("data-tone", "down")
        assert "Your GPU was reclaimed" in (bar.get_attribute("title") or "")
        shot(shoot, page, f"lab-reclaimed-{kind.replace('_', '-')}")
    finally:
        for step in undo:
            if callable(step):
                step()
            else:
                request(*step, lab.env.token("admin"))
        request("DELETE", f"{lab.env.hub_api}/users/bob/server", lab.env.admin_api_token)
        wait_until(lambda: not lab.server("bob"), 120, "bob's server to stop")
        if page is not None:
            page.context.close()
