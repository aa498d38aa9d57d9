"""GPU kernels in the demo, in Chromium (issue 36): a CPU-only server opens a notebook on a
"Python 3 (GPU: A100 · 1g.10gb slice)" kernel and a cell reads the MIG device the kernel's own
lease was granted; a second user's H100 kernel waits behind the first user's, with its queue
position in the pool's ``GET kernels`` and its server's log, the page showing the kernel still
initializing and a notification "Waiting for a GPU (…): position 1 in the queue" with Cancel,
and the panel's "GPU kernels" listing it in line; once the first H100 kernel is shut down the
waiting one starts and runs its cell, and the notification is gone; the first user's next H100
kernel waits too, and Cancel in its notification ends the start (the demo runs as in
``tests/browser/conftest.py``, with the tutorial's small pool: one H100, one MIG A100)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("playwright.sync_api")

from playwright.sync_api import expect

from tests.browser.conftest import CHROMIUM, Demo, run_first_cell
from tests.demoproc import user_token
from tests.fakes import request, wait_until

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]

A100 = "Python 3 (GPU: A100 · 1g.10gb slice)"
H100 = "Python 3 (GPU: 1× H100 80GB)"
LAB_TIMEOUT = 180_000
#: the notification of bob's waiting H100 kernel (the offer's name as his kernelspec has it)
WAITING = re.compile(r"Waiting for a GPU \(.*H100.*\): position 1 in the queue")


def cpu_only_lab(demo: Demo, login: Callable[[str], Any], user: str) -> tuple[Any, str, str]:
    """``user`` logs in, picks "No GPU" and lands in JupyterLab; answers the page, an API token
    and the server's URL, once the server lists its GPU kernelspecs."""
    page = login(user)
    page.locator('#gpupool-picker .gpupool-offer[data-offer=""] input[type=radio]').check()
    page.locator('#spawn_form [type="submit"]').click()
    page.locator("#jp-main-dock-panel").wait_for(timeout=LAB_TIMEOUT)
    token, base = user_token(demo.url, user), f"{demo.url}/user/{user}"

    def specs() -> set[str]:
        answer = request("GET", f"{base}/api/kernelspecs", token)
        return set(answer.json()["kernelspecs"]) if answer.status == 200 else set()

    wait_until(
        lambda: {"gpupool-a100-1g", "gpupool-h100"} <= specs(), 120, "the GPU kernelspecs", step=0.5
    )
    return page, token, base


def notebook(base: str, token: str, path: str, spec: str, display: str, source: str) -> None:
    """A one-cell notebook on the kernelspec ``spec``, through the contents API."""
    cell = {"cell_type": "code", "execution_count": None, "id": "c", "metadata": {}}
    cell |= {"outputs": [], "source": source}
    meta = {"kernelspec": {"display_name": display, "language": "python", "name": spec}}
    nb = {"cells": [cell], "metadata": meta, "nbformat": 4, "nbformat_minor": 5}
    body = {"type": "notebook", "content": nb}
    answer = request("PUT", f"{base}/api/contents/{path}", token, body)
    assert answer.status in (200, 201), answer.body


def kernel_leases(demo: Demo, token: str) -> list[dict[str, Any]]:
    answer = request("GET", f"{demo.url}/services/gpupool/api/v1/kernels", token)
    assert answer.status == 200, answer.body
    return answer.json()["kernels"]


def kernel_button(page: Any, display: str, state: str) -> Any:
    name = re.compile(re.escape(f"{display} | {state}"))
    return page.get_by_role("button", name=name)


PRINT_DEVICE = "import os\nprint('device', os.environ['CUDA_VISIBLE_DEVICES'])"


def test_a_cpu_server_runs_a_gpu_kernel_and_a_second_one_queues(
    demo: Demo, login: Callable[[str], Any], shoot: Any
) -> None:
    alice, a_token, a_base = cpu_only_lab(demo, login, "alice")
    # the server is CPU-only: no server lease, only kernel leases below
    assert kernel_leases(demo, a_token) == []
    notebook(a_base, a_token, "gpu.ipynb", "gpupool-a100-1g", A100, PRINT_DEVICE)
    alice.goto(f"{a_base}/lab/tree/gpu.ipynb")
    expect(kernel_button(alice, A100, "Idle")).to_be_visible(timeout=LAB_TIMEOUT)
    output = run_first_cell(alice, "device MIG-")
    expect(alice.locator("#jp-main-statusbar")).to_contain_text("GPU: CPU only")
    (lease,) = kernel_leases(demo, a_token)
    assert lease["offer"] == "a100-1g" and lease["state"] in ("granted", "active")
    (device,) = lease["devices"]
    assert output.inner_text().strip() == f"device {device['mig']['uuid']}"
    shoot(alice, "gpu-kernel-cpu-server")

    # alice takes the one H100 with a second GPU kernel (started through her server's API)
    notebook(a_base, a_token, "train.ipynb", "gpupool-h100", H100, PRINT_DEVICE)
    body = {"path": "train.ipynb", "type": "notebook", "kernel": {"name": "gpupool-h100"}}
    started = request("POST", f"{a_base}/api/sessions", a_token, body)
    assert started.status == 201, started.body
    session = started.json()
    held = {k["offer"]: k for k in kernel_leases(demo, a_token)}
    assert held["h100"]["kernel_id"] == session["kernel"]["id"]

    # bob's H100 kernel waits: queued, first in line, the page still starting it
    bob, b_token, b_base = cpu_only_lab(demo, login, "bob")
    notebook(b_base, b_token, "wait.ipynb", "gpupool-h100", H100, PRINT_DEVICE)
    bob.goto(f"{b_base}/lab/tree/wait.ipynb")
    queued = wait_until(
        lambda: [k for k in kernel_leases(demo, b_token) if k["state"] == "queued"],
        120,
        "bob's queued kernel lease",
        step=0.5,
    )
    assert queued[0]["offer"] == "h100" and queued[0]["position"] == 1
    expect(bob.locator(".jp-Notebook .jp-Cell")).to_have_count(1, timeout=LAB_TIMEOUT)
    # what bob sees: his kernel still starting (its queue position is the pool's, below)
    starting = re.compile(re.escape(f"{H100} | ") + "(Initializing|Starting)")
    expect(bob.locator("#jp-main-statusbar")).to_contain_text(starting)
    expect(kernel_button(bob, H100, "Idle")).to_have_count(0)
    # ... and where he looks, a notification with his place in the queue, which he may cancel
    waiting = bob.locator(".Toastify__toast").filter(has_text=WAITING)
    expect(waiting).to_be_visible(timeout=60_000)
    expect(waiting.get_by_role("button", name="Cancel")).to_be_visible()
    # the panel's "GPU kernels": his kernel lease, in line for the H100
    bob.locator(".jp-GPUPool-status-button").click()
    kernels = bob.locator("#jp-gpupool-panel .jp-GPUPool-kernels")
    expect(kernels).to_contain_text("queued, 1st in line", timeout=30_000)
    expect(waiting).to_be_in_viewport(ratio=1)  # the toast has slid in: the shot shows it
    shoot(bob, "gpu-kernel-queued")
    log = demo.state / "jupyterhub.log"
    wait_until(
        lambda: "waits for h100: position 1 in the queue" in log.read_text(errors="replace"),
        120,
        "the queue position in bob's server log",
        step=0.5,
    )

    # alice shuts her H100 kernel down: its lease ends, bob's kernel starts and runs
    gone = request("DELETE", f"{a_base}/api/sessions/{session['id']}", a_token)
    assert gone.status == 204, gone.body
    expect(kernel_button(bob, H100, "Idle")).to_be_visible(timeout=LAB_TIMEOUT)
    expect(bob.locator(".Toastify__toast").filter(has_text=WAITING)).to_have_count(0)
    expect(kernels).to_contain_text("running", timeout=30_000)
    (granted,) = kernel_leases(demo, b_token)
    assert granted["state"] in ("granted", "active") and granted["offer"] == "h100"
    output = run_first_cell(bob, "device ")
    assert output.inner_text().strip() == f"device {granted['devices'][0]['gpu']}"
    assert [k["offer"] for k in kernel_leases(demo, a_token)] == ["a100-1g"]

    # alice reopens her H100 notebook: it waits behind bob's kernel; Cancel in the notification
    # gives the place back, the start fails saying so, and her other kernel runs on
    alice.goto(f"{a_base}/lab/tree/train.ipynb")
    queued = alice.locator(".Toastify__toast").filter(has_text=WAITING)
    expect(queued).to_be_visible(timeout=LAB_TIMEOUT)
    queued.get_by_role("button", name="Cancel").click()
    failed = alice.locator(".jp-Dialog")
    expect(failed).to_contain_text("GPU kernel start cancelled", timeout=60_000)
    expect(queued).to_have_count(0)
    shoot(alice, "gpu-kernel-cancelled")
    assert [k["offer"] for k in kernel_leases(demo, a_token)] == ["a100-1g"]

    # the pool's own user page names her kernel lease as a GPU kernel, not a server
    (mine,) = kernel_leases(demo, a_token)
    alice.goto(f"{demo.url}/services/gpupool/")
    row = alice.locator(f'#gpupool-leases tr[data-lease="{mine["id"]}"]')
    expect(row).to_contain_text(f"GPU kernel {mine['kernel_id'][:8]}", timeout=60_000)
