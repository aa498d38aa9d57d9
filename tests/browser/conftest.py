"""The demo as users meet it: ``jupyterhub-gpupool demo`` started for real, Chromium logged in.

The demo runs as a subprocess on free ports (public, hub API, pool service, proxy API) with the
tutorial's small pool, so a queue forms at once and a running ``make demo`` is never disturbed.
Playwright drives Debian's Chromium (never ``playwright install``). With
``GPUPOOL_SCREENSHOTS=DIR`` the tests save the screenshots the tutorial shows
(``docs/source/_static/screenshots/``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import ROOT, chp_command, free_port, request

CHROMIUM = Path("/usr/bin/chromium")
VIEWPORT = {"width": 1200, "height": 800}

#: The tutorial's pool: one whole H100 (so the second user queues) and one A100 cut into MIG
#: slices on demand; the tutorial tells readers to run the demo with this very file.
POOL = ROOT / "docs" / "source" / "tutorial" / "small-pool.yaml"

#: JupyterLab's "get notified about Jupyter news?" toast would cover the screenshots
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": (
        '{"fetchNews": "false", "checkForUpdates": false}'
    ),
}


@dataclass
class Demo:
    """A running ``jupyterhub-gpupool demo``."""

    url: str
    state: Path
    out: Path
    proc: subprocess.Popen

    def logs(self) -> str:
        """The launcher's output and the tail of the hub's log (for failure messages)."""
        parts = []
        for path in (self.out, self.state / "jupyterhub.log"):
            if path.exists():
                parts.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-6000:])
        return "\n".join(parts)

    def stop(self) -> None:
        """Ctrl-C the launcher (it stops the hub, which stops servers, proxy and service),
        then kill whatever of this demo outlived it."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in _pids_of(self.state):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def run_first_cell(page: Any, expected: str, output: Any = None) -> Any:
    """Run the open notebook's first cell until ``output`` (its first output area unless
    given) says ``expected``: a kernel not connected yet ignores the first run. Answers the
    output."""
    from playwright.sync_api import expect

    if output is None:
        output = page.locator(".jp-OutputArea-output").first
    for attempt in range(3):
        page.locator(".jp-Notebook .jp-Cell").first.click()
        page.keyboard.press("Shift+Enter")
        try:
            expect(output).to_contain_text(expected, timeout=30_000)
            return output
        except AssertionError:
            if attempt == 2:
                raise
    return output


def _pids_of(state: Path) -> list[int]:
    """Processes of this demo: started in its state folder or naming it on their command line
    (hub, proxy, pool service, single-user servers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cwd == str(state) or cwd.startswith(f"{state}/") or str(state) in cmdline:
            found.append(int(entry.name))
    return found


def _wait_for(check: Callable[[], bool], what: str, demo: Demo, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if demo.proc.poll() is not None:
            raise RuntimeError(f"the demo exited ({demo.proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s\n{demo.logs()}")
        time.sleep(0.3)


def start_demo(base: Path, *extra: str) -> Demo:
    """Start ``python -m jupyterhub_gpupool.cli demo`` on free ports (``extra``: more of its
    flags, such as ``--short-reclaim``); wait until it serves."""
    state = base / "state"
    for name, text in LAB_SETTINGS.items():
        for user in ("alice", "bob", "carol", "admin"):
            path = state / "home" / user / ".jupyter/lab/user-settings" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    port = free_port()
    env = dict(
        os.environ,
        GPUPOOL_DEMO_HUB_PORT=str(free_port()),
        GPUPOOL_DEMO_SERVICE_PORT=str(free_port()),
        GPUPOOL_DEMO_PROXY_API_PORT=str(free_port()),
    )
    out = base / "demo.out"
    argv = [
        *(sys.executable, "-m", "jupyterhub_gpupool.cli", "demo"),
        *("--gpus", "sim", "--pool-config", str(POOL), "--state-dir", str(state)),
        *("--port", str(port), "--proxy", chp_command()),
        *extra,
    ]
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    demo = Demo(f"http://127.0.0.1:{port}", state, out, proc)
    try:
        _wait_for(lambda: "is running at" in out.read_text(), "the demo's banner", demo, 120)
        _wait_for(lambda: request("GET", f"{demo.url}/hub/api/").status == 200, "hub API", demo, 60)
        # the picker needs the pool service, which the hub starts and the proxy routes
        pool_api = f"{demo.url}/services/gpupool/api/v1/pool"
        _wait_for(
            lambda: request("GET", pool_api).status not in (404, 502, 503), "pool API", demo, 60
        )
    except BaseException:
        print(demo.logs())
        demo.stop()
        raise
    return demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """The demo, running for the whole module; stopped (with its servers) afterwards."""
    running = start_demo(tmp_path_factory.mktemp("demo"))
    try:
        yield running
    finally:
        running.stop()
        print(running.logs())  # shown when a test failed


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium from Debian."""
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def login(demo: Demo, browser: Any) -> Iterator[Callable[[str], Any]]:
    """``login(user)``: a fresh browser context logged in through the hub's login form;
    returns its page, on the spawn form (the GPU picker)."""
    contexts = []

    def log_in(user: str) -> Any:
        context = browser.new_context(viewport=VIEWPORT)
        context.set_default_timeout(30_000)
        contexts.append(context)
        page = context.new_page()
        page.goto(f"{demo.url}/hub/login")
        page.fill("#username_input", user)
        page.fill("#password_input", "any password")
        page.click("#login_submit")
        page.wait_for_url("**/hub/spawn**")
        return page

    yield log_in
    for context in contexts:
        context.close()


@pytest.fixture
def shoot() -> Callable[..., None]:
    """``shoot(page, name, down_to=None, full=False)``: save ``name.png`` into
    $GPUPOOL_SCREENSHOTS (when set); with ``down_to`` (a selector), only down to that element,
    not the empty page below; with ``full``, the whole page, however long."""
    folder = os.environ.get("GPUPOOL_SCREENSHOTS")

    def screenshot(page: Any, name: str, down_to: str | None = None, full: bool = False) -> None:
        if not folder:
            return
        Path(folder).mkdir(parents=True, exist_ok=True)
        if full:
            page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)
            return
        clip = None
        if down_to:
            box = page.locator(down_to).bounding_box()
            height = min(VIEWPORT["height"], int(box["y"] + box["height"]) + 24)
            clip = {"x": 0, "y": 0, "width": VIEWPORT["width"], "height": height}
        page.screenshot(path=str(Path(folder) / f"{name}.png"), clip=clip)

    return screenshot


@pytest.fixture
def hub_login(browser: Any) -> Iterator[Callable[[Any, str], Any]]:
    """``hub_login(hub, user)``: a fresh browser context logged in through the login form of a
    ``tests.fakes.HubEnv`` (under its base URL); returns its page. A dialog the page opens
    (``alert``: a hostile name that ran) fails the test; the contexts close afterwards."""
    contexts = []

    def log_in(hub: Any, user: str) -> Any:
        context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
        context.set_default_timeout(30_000)
        contexts.append(context)
        page = context.new_page()
        page.on("dialog", lambda d: pytest.fail(f"a page opened a dialog: {d.message!r}"))
        page.on("pageerror", lambda e: print(f"page error: {e}"))
        page.goto(f"{hub.hub_url}{hub.base_url}hub/login")
        page.fill("#username_input", user)
        page.fill("#password_input", "any password")
        page.click("#login_submit")
        page.wait_for_url(f"**{hub.base_url}hub/**")
        return page

    yield log_in
    for context in contexts:
        context.close()
