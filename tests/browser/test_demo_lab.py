"""``make demo``'s single-user servers have ``jupyterlab-gpupool``: a new user who picks a GPU
lands in JupyterLab with the GPU in the status bar and the panel on it, and the widget works in
the demo's kernels (the demo runs as in ``tests/browser/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("playwright.sync_api")
pytest.importorskip("jupyterlab_gpupool", reason="make demo installs ./labextension")

from playwright.sync_api import expect

CHROMIUM = Path("/usr/bin/chromium")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]


def test_a_new_user_sees_the_gpu_panel_on_first_login(demo, login):
    page = login("carol")
    page.locator('#gpupool-picker .gpupool-offer[data-offer="a100-1g"] input[type=radio]').check()
    page.locator('#spawn_form [type="submit"]').click()
    page.locator("#jp-main-dock-panel").wait_for(timeout=180_000)
    bar = page.locator(".jp-GPUPool-status-button")
    expect(bar).to_contain_text("A100 1g.10gb", timeout=60_000)
    bar.click()
    panel = page.locator("#jp-gpupool-panel")
    expect(panel).to_be_visible()
    expect(panel).to_contain_text("A100 · 1g.10gb slice (a100-1g)")
    expect(panel).to_contain_text("MIG-")
    expect(panel).to_contain_text("GPU units in use")
    expect(panel).to_contain_text("NVML is switched off")  # simulated GPUs: said plainly
