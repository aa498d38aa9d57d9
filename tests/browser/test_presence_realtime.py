"""Presence is real input, shown in real time on the demo's real processes.

The demo runs with ``--short-reclaim`` (a notice after 1 min of idleness, the reclaim 1 min
later) and its reclaimer at its real round interval (30 s); the hub, the proxy and the users'
servers stamp activity with the wall clock, so no moved clock could show this. Four users at
once, one minute-scale run:

* bob starts a server and closes his browser: noticed, then reclaimed;
* alice, autosave off, types into a notebook and a text file, leaves both unsaved and her
  JupyterLab tab open, visible and untouched (it polls the server all the while): noticed,
  then reclaimed, and both files on disk hold her edits, listed as saved by the pool and on
  her page;
* carol types in a notebook every minute: never noticed;
* the admin runs a long cell and leaves it running: never noticed (the simulated GPU cannot see
  a demo kernel's work, so the busy kernel is what keeps it; on real GPUs both would).

Then GPU kernels on the same short timers (a notice after 1 min of running nothing, the shutdown
1 min later): bob, on a CPU-only server, runs a cell of a notebook on a GPU kernel, types an edit
he never saves and leaves the tab open and untouched; the notice appears in that tab, the
notebook on disk then holds his edit, and the pool shuts the kernel down (released ``idle``).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("playwright.sync_api")
pytest.importorskip("jupyterlab_gpupool", reason="make demo installs ./labextension")

from types import SimpleNamespace

from playwright.sync_api import expect

from tests.browser.conftest import CHROMIUM, VIEWPORT, Demo, run_first_cell, start_demo
from tests.demoproc import user_token
from tests.fakes import KernelDriver, request, wait_until

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]

OFFER = "a100-1g"
#: Long enough for a notice (1 min idle) and the reclaim (1 min later), with rounds of 30 s
#: and the servers' own start; the reclaimed leases usually end after about 2.5 min.
WATCH = 390.0
#: Carol's keystrokes: a little under a minute apart.
TYPING_EVERY = 50.0


@pytest.fixture(scope="module")
def short_demo(tmp_path_factory: pytest.TempPathFactory):
    running = start_demo(tmp_path_factory.mktemp("presence"), "--short-reclaim")
    try:
        yield running
    finally:
        running.stop()
        print(running.logs())


def api(demo: Demo, token: str, path: str, method: str = "GET", body: Any = None) -> Any:
    req = urllib.request.Request(
        f"{demo.url}/{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"{}")


def lab_page(browser: Any, demo: Demo, user: str) -> Any:
    """``user`` logged in, a server on ``OFFER`` started from the picker, JupyterLab open."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(60_000)
    page = context.new_page()
    page.goto(f"{demo.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", "any password")
    page.click("#login_submit")
    page.wait_for_url("**/hub/spawn**")
    page.locator(f'#gpupool-picker .gpupool-offer[data-offer="{OFFER}"] input[type=radio]').check()
    page.locator('#spawn_form [type="submit"]').click()
    page.locator("#jp-main-dock-panel").wait_for(timeout=180_000)
    page.locator(".jp-GPUPool-status-button").wait_for(timeout=60_000)
    return page


def new_notebook(page: Any) -> Any:
    """A new notebook from the launcher, its kernel idle; returns the first cell's editor."""
    page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle'], "
                 ".jp-Notebook .jp-Cell").first.wait_for(timeout=120_000)  # fmt: skip
    editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
    editor.wait_for()
    return editor


def state_of(demo: Demo, admin: str, user: str) -> tuple[dict | None, list[str]]:
    """The user's newest lease and the kinds of its audit events."""
    items = api(demo, admin, f"services/gpupool/api/v1/allocations?user={user}&limit=100")["items"]
    if not items:
        return None, []
    lease = max(items, key=lambda le: le["created"])
    events = api(demo, admin, f"services/gpupool/api/v1/events?lease={lease['id']}&limit=500")
    return lease, [e["kind"] for e in events["items"]]


ALICE_NOTEBOOK = {
    "cells": [{"cell_type": "code", "execution_count": None, "id": "c1", "metadata": {},
               "outputs": [], "source": ""}],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                "name": "python3"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}  # fmt: skip


def alices_files(demo: Demo) -> Path:
    """Alice's home with a notebook and a text file to edit, and autosave off: whatever she
    types stays unsaved until something saves it."""
    home = demo.state / "home" / "alice"
    settings = home / ".jupyter/lab/user-settings/@jupyterlab/docmanager-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "plugin.jupyterlab-settings").write_text('{"autosave": false}')
    (home / "work.ipynb").write_text(json.dumps(ALICE_NOTEBOOK))
    (home / "notes.txt").write_text("")
    return home


def edit_unsaved(page: Any) -> None:
    """Open work.ipynb and notes.txt from the file browser and type into each; leave both
    unsaved (the tabs show the dirty mark)."""
    edits = (("work.ipynb", "x = 42  # typed, never saved"), ("notes.txt", "remember this"))
    for name, text in edits:
        page.locator(f'.jp-DirListing-itemName:has-text("{name}")').first.dblclick()
        editor = page.locator(".jp-MainAreaWidget:not(.lm-mod-hidden) .cm-content").first
        editor.wait_for(timeout=60_000)
        editor.click()
        page.keyboard.type(text)
        page.locator(".lm-TabBar-tab.jp-mod-dirty").nth(0 if name == "work.ipynb" else 1).wait_for()


def test_only_real_input_keeps_an_idle_gpu_and_a_reclaim_saves_unsaved_edits(
    short_demo: Demo, browser: Any
) -> None:
    demo = short_demo
    admin = user_token(demo.url, "admin")
    home = alices_files(demo)
    # the admin: a long cell running in a kernel whose notebook stays connected
    runner_token = user_token(demo.url, "admin")
    api(demo, runner_token, "hub/api/users/admin/server", "POST", {"gpupool_offer": OFFER})
    wait_until(
        lambda: api(demo, runner_token, "hub/api/users/admin")["servers"].get("", {}).get("ready"),
        180,
        "the admin's server",
    )
    hub = SimpleNamespace(hub_url=demo.url, token=lambda user: runner_token)
    kernel = KernelDriver(hub, "admin")  # type: ignore[arg-type]
    kernel.start()
    kernel.execute("import time; time.sleep(3600)", stay_connected=True)
    # bob: a server, and no browser at all (as after closing it)
    bob = user_token(demo.url, "bob")
    api(demo, bob, "hub/api/users/bob/server", "POST", {"gpupool_offer": OFFER})
    # alice: JupyterLab with two unsaved edits (autosave off), then open, visible, untouched
    alice = lab_page(browser, demo, "alice")
    edit_unsaved(alice)
    # carol: a notebook she types into every minute, from now on
    carol = lab_page(browser, demo, "carol")
    carol_cell = new_notebook(carol)
    carol_cell.click()
    carol.keyboard.type("# typing")

    started = last_key = time.monotonic()
    seen: dict[str, tuple[dict | None, list[str]]] = {}
    timeline: dict[tuple[str, str], int] = {}
    while time.monotonic() - started < WATCH:
        if time.monotonic() - last_key >= TYPING_EVERY:
            carol_cell.click()
            carol.keyboard.type("x")
            last_key = time.monotonic()
        seen = {u: state_of(demo, admin, u) for u in ("alice", "bob", "carol", "admin")}
        for user, (_, kinds) in seen.items():  # when each thing first happened
            for what in ("reclaim-notice", "reclaimed"):
                if what in kinds and (user, what) not in timeline:
                    timeline[(user, what)] = round(time.monotonic() - started)
        for user in ("carol", "admin"):
            assert "reclaim-notice" not in seen[user][1], (user, seen[user])
        # both reclaimed (the reclaimer's outcome recorded, not only the lease released by the
        # server's stop), and the other two watched for at least 3 min (3 notice periods)
        done = all("reclaimed" in seen[u][1] for u in ("alice", "bob"))
        if done and time.monotonic() - started > 180:
            break
        time.sleep(5)
    print("seconds after the last server started:", timeline)
    for user in ("alice", "bob"):
        lease, kinds = seen[user]
        assert lease is not None and lease["state"] == "released", (user, lease, kinds)
        assert "reclaim-notice" in kinds and "reclaimed" in kinds, (user, kinds)
    for user in ("carol", "admin"):
        lease, kinds = seen[user]
        assert lease is not None and lease["state"] == "active", (user, lease, kinds)
        assert "reclaim-notice" not in kinds, (user, kinds)

    # nothing alice typed is lost: both files hold her edits, and the pool lists them saved
    notebook = json.loads((home / "work.ipynb").read_text())
    assert "x = 42  # typed, never saved" in "".join(notebook["cells"][0]["source"])
    assert (home / "notes.txt").read_text() == "remember this"
    reclaims = api(demo, admin, "services/gpupool/api/v1/users/alice")["reclaims"]
    assert set(reclaims[0]["saved"]) >= {"work.ipynb", "notes.txt"}, reclaims
    # alice's lab tab, still open, says so from the pool's record, the saved files named
    said = alice.locator("#jp-gpupool-panel .jp-GPUPool-reclaimed")
    expect(said).to_have_attribute("data-source", "pool", timeout=90_000)
    expect(said).to_contain_text("work.ipynb")
    expect(said).to_contain_text("notes.txt")
    page = alice.context.new_page()  # the user page, as alice opens it after the reclaim
    page.goto(f"{demo.url}/services/gpupool/")
    recent = page.locator("body").inner_text().split("Recent reclaims")[1]
    assert "work.ipynb" in recent and "notes.txt" in recent, recent

    kernel.disconnect()
    for tab in (alice, carol):
        tab.context.close()


#: bob's GPU kernel (the demo's A100 slice offer, as his server's kernelspecs name it)
GPU_SPEC, GPU_DISPLAY = "gpupool-a100-1g", "Python 3 (GPU: A100 · 1g.10gb slice)"


def test_an_idle_gpu_kernel_is_noticed_in_its_open_tab_its_edit_saved_then_shut_down(
    short_demo: Demo, browser: Any, shoot: Any
) -> None:
    demo = short_demo
    token = user_token(demo.url, "bob")
    hub_user = f"{demo.url}/hub/api/users/bob"
    request("DELETE", f"{hub_user}/server", token)  # the test above reclaimed his; or none
    wait_until(lambda: request("GET", hub_user, token).json()["servers"] == {}, 120, "no server")
    home = demo.state / "home" / "bob"
    settings = home / ".jupyter/lab/user-settings/@jupyterlab/docmanager-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "plugin.jupyterlab-settings").write_text('{"autosave": false}')
    cell = {
        "cell_type": "code",
        "execution_count": None,
        "id": "c1",
        "metadata": {},
        "outputs": [],
        "source": "import os\nprint('device', os.environ['CUDA_VISIBLE_DEVICES'])",
    }
    meta = {"kernelspec": {"display_name": GPU_DISPLAY, "language": "python", "name": GPU_SPEC}}
    (home / "gpu.ipynb").write_text(
        json.dumps({"cells": [cell], "metadata": meta, "nbformat": 4, "nbformat_minor": 5})
    )  # fmt: skip

    # bob logs in, picks "No GPU" and opens the notebook: its kernel takes a slice of its own
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(60_000)
    page = context.new_page()
    page.goto(f"{demo.url}/hub/login")
    page.fill("#username_input", "bob")
    page.fill("#password_input", "any password")
    page.click("#login_submit")
    page.wait_for_url("**/hub/spawn**")
    page.locator('#gpupool-picker .gpupool-offer[data-offer=""] input[type=radio]').check()
    page.locator('#spawn_form [type="submit"]').click()
    page.locator("#jp-main-dock-panel").wait_for(timeout=180_000)
    page.goto(f"{demo.url}/user/bob/lab/tree/gpu.ipynb")
    idle = page.get_by_role("button", name=f"{GPU_DISPLAY} | Idle")
    expect(idle).to_be_visible(timeout=180_000)
    run_first_cell(page, "device MIG-")
    leases = f"{demo.url}/services/gpupool/api/v1/kernels"
    [lease] = [k for k in request("GET", leases, token).json()["kernels"] if k["state"] == "active"]
    # an edit he never saves (autosave is off); then the tab stays open and untouched
    editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
    editor.click()
    page.keyboard.press("Control+End")
    page.keyboard.type("  # bob's edit, never saved")
    page.locator(".lm-TabBar-tab.jp-mod-dirty").first.wait_for()

    # a minute of running nothing: the notice, in the notebook's own tab
    notice = page.locator(".Toastify__toast").filter(has_text="has not run anything for 1 min")
    expect(notice).to_be_visible(timeout=240_000)
    expect(notice).to_contain_text(GPU_DISPLAY)
    # the notebook is on disk with his edit before the kernel goes
    wait_until(
        lambda: "bob's edit, never saved" in (home / "gpu.ipynb").read_text(),
        60,
        "the notebook saved at the notice",
    )
    expect(page.locator(".lm-TabBar-tab.jp-mod-dirty")).to_have_count(0)
    expect(notice).to_be_in_viewport(ratio=1)  # the toast has slid in: the shot shows it
    shoot(page, "gpu-kernel-idle-notice")
    # a minute later the pool shuts the kernel down and releases its slice
    url = f"{leases}/{lease['kernel_id']}"
    wait_until(lambda: request("GET", url, token).json()["state"] == "released", 240, "release")
    assert request("GET", url, token).json()["release_reason"] == "idle"
    expect(notice).to_have_count(0, timeout=60_000)
    context.close()
