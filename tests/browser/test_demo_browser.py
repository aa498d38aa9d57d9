"""``make demo`` in a browser: log in, pick a GPU, queue behind someone, get it when they stop.

The tutorial (docs/source/tutorial/demo.md) tells this story with the screenshots these tests
take (``GPUPOOL_SCREENSHOTS=docs/source/_static/screenshots``), on its pool
(docs/source/tutorial/small-pool.yaml): alice picks the only H100 and lands in JupyterLab pinned
to it, bob asks for the same H100 and waits first in line, carol sees the queue in the picker and
takes a MIG slice instead, alice stops and bob's server starts on the H100. A forged offer from
the form is refused with a message on the form.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

pytest.importorskip("playwright.sync_api")

from playwright.sync_api import Page, expect

#: Debian's Chromium (Playwright's own browsers are never installed)
CHROMIUM = Path("/usr/bin/chromium")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]

#: JupyterLab's main area: the server is up and the lab has loaded (slow on 2 cores)
LAB = "#jp-main-dock-panel"
LAB_TIMEOUT = 120_000
NOTEBOOK = "which-gpu.ipynb"
#: what the tutorial runs in a notebook: the devices the server sees, the pool's variables
CHECK = "!echo $CUDA_VISIBLE_DEVICES\n!env | grep ^GPUPOOL_ | sort"


def stop(page: Page, demo) -> None:
    """Stop the user's server with the hub home page's "Stop My Server" button; return once
    the hub has stopped it (the spawn form shows the picker again)."""
    page.goto(f"{demo.url}/hub/home")
    page.locator("#stop").click()
    expect(page.locator("#start")).to_be_visible(timeout=60_000)
    deadline = time.monotonic() + 60
    while True:
        page.goto(f"{demo.url}/hub/spawn")  # "Your server is stopping" until it has
        if page.locator("#gpupool-picker").count():
            return
        assert time.monotonic() < deadline, "the server did not stop within 60 s"
        page.wait_for_timeout(500)


def offer(page: Page, name: str):
    """The picker's card for offer ``name``."""
    return page.locator(f'#gpupool-picker .gpupool-offer[data-offer="{name}"]')


def start(page: Page, name: str) -> None:
    """Pick offer ``name`` and press Start."""
    offer(page, name).locator("input[type=radio]").check()
    page.locator('#spawn_form [type="submit"]').click()


def notebook(demo, user: str, name: str, code: str) -> None:
    """Put a notebook with one code cell into ``user``'s home folder."""
    cell = {
        "cell_type": "code",
        "execution_count": None,
        "id": "gpu",
        "metadata": {},
        "outputs": [],
        "source": code,
    }
    kernel = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nb = {"cells": [cell], "metadata": {"kernelspec": kernel}, "nbformat": 4, "nbformat_minor": 5}
    (demo.state / "home" / user / name).write_text(json.dumps(nb))


def run_all(page: Page, url: str, expected: str) -> str:
    """Open the notebook at ``url`` in JupyterLab, run it from the Run menu, return the first
    output once it contains ``expected``.

    A notebook whose kernel is not connected yet ignores a run, so: wait for the status bar to
    say the kernel is idle, and run again if nothing came out (slow machines)."""
    page.goto(url)
    expect(page.locator(".jp-Notebook .jp-Cell")).to_have_count(1, timeout=LAB_TIMEOUT)
    kernel_idle = page.get_by_role("button", name=re.compile(r"Python 3 \(ipykernel\) \| Idle"))
    expect(kernel_idle).to_be_visible(timeout=60_000)
    output = page.locator(".jp-OutputArea-output").first
    for attempt in range(3):
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile("^Run All Cells$")).click()
        try:
            expect(output).to_contain_text(expected, timeout=20_000)
            break
        except AssertionError:
            if attempt == 2:
                raise
    return output.inner_text()


def test_pick_queue_and_hand_over(demo, login, shoot):
    # alice: the picker shows what is free, what it costs and her quota
    alice = login("alice")
    h100 = offer(alice, "h100")
    expect(h100).to_contain_text("1× H100 80GB")
    expect(h100).to_contain_text("1 free now")
    expect(h100).to_contain_text("costs 1 GPU of your quota")
    mig = offer(alice, "a100-1g")
    expect(mig).to_contain_text("7 free now")  # seven 1g.10gb slices fit on the A100
    expect(mig).to_contain_text("costs 1/7 GPU of your quota")
    expect(alice.locator("#gpupool-quota")).to_contain_text("up to 2 GPUs at a time")
    expect(offer(alice, "")).to_contain_text("No GPU")
    shoot(alice, "picker", down_to="#spawn_form")

    # she takes the H100 and lands in JupyterLab, pinned to it
    notebook(demo, "alice", NOTEBOOK, CHECK)
    start(alice, "h100")
    expect(alice.locator(LAB)).to_be_visible(timeout=LAB_TIMEOUT)
    assert "/user/alice/lab" in alice.url, alice.url
    out = run_all(alice, f"{demo.url}/user/alice/lab/tree/{NOTEBOOK}", "GPUPOOL_OFFER")
    assert re.search(r"^GPU-[0-9a-f-]{36}$", out, re.M), out
    assert "GPUPOOL_OFFER=h100" in out and "GPUPOOL_LEASE_ID=" in out, out
    shoot(alice, "lab")

    # bob wants the H100 too: the picker says it is taken; he queues, first in line
    bob = login("bob")
    expect(offer(bob, "h100")).to_contain_text("none free now")
    expect(offer(bob, "h100")).to_contain_text("you would be 1st in line")
    start(bob, "h100")
    expect(bob.locator("#progress-message")).to_contain_text(
        "Waiting for 1× H100 80GB: 1st in line", timeout=60_000
    )
    assert "/hub/spawn-pending/bob" in bob.url, bob.url
    bob.locator("#progress-details summary").click()  # the event log, for the screenshot
    expect(bob.locator("#progress-log")).to_contain_text("Asking the GPU pool for 1× H100 80GB")
    shoot(bob, "queue", down_to="#stop-server-btn")

    # carol sees bob waiting, and takes a MIG slice instead: her server sees only that slice
    carol = login("carol")
    expect(offer(carol, "h100")).to_contain_text("1 waiting, you would be 2nd in line")
    shoot(carol, "picker-queue", down_to="#spawn_form")
    notebook(demo, "carol", NOTEBOOK, CHECK)
    start(carol, "a100-1g")
    expect(carol.locator(LAB)).to_be_visible(timeout=LAB_TIMEOUT)
    out = run_all(carol, f"{demo.url}/user/carol/lab/tree/{NOTEBOOK}", "GPUPOOL_OFFER")
    assert re.search(r"^MIG-[0-9a-f-]{36}$", out, re.M), out
    assert "GPUPOOL_OFFER=a100-1g" in out, out

    # alice stops her server from the hub's home page: the H100 goes to bob, whose page
    # moves on by itself into JupyterLab
    stop(alice, demo)
    expect(bob.locator(LAB)).to_be_visible(timeout=LAB_TIMEOUT)
    assert "/user/bob/lab" in bob.url, bob.url
    stop(carol, demo)
    expect(offer(carol, "h100")).to_contain_text("none free now")
    expect(offer(carol, "h100")).to_contain_text("you would be 1st in line")  # nobody waits


def test_forged_offer_is_refused(demo, login):
    carol = login("carol")
    # a hand-edited form: the slice's radio button now names an offer that does not exist
    carol.evaluate(
        """() => {
            const radio = document.querySelector('input[value="a100-1g"]');
            radio.value = "free-h100-for-me";
            radio.checked = true;
        }"""
    )
    carol.locator('#spawn_form [type="submit"]').click()
    error = carol.locator(".spawn-error-msg")
    expect(error).to_contain_text("There is no GPU offer called 'free-h100-for-me'")
    expect(error).not_to_contain_text("SpawnException")
    expect(carol.locator("#gpupool-picker")).to_be_visible()  # she can choose again
    carol.goto(f"{demo.url}/hub/home")
    expect(carol.locator("#start")).to_be_visible()  # and no server was started
