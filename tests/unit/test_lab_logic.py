"""The lab package's pure parts: what the panel says a lease is, the quota's reset, which lease
a server runs on (and a stale ``GPUPOOL_LEASE_ID``), the resize choices, the widget's text, and
local NVML readings of MIG devices through the simulated NVML (pynvml's names)."""

from __future__ import annotations

from datetime import datetime

import pytest

pytest.importorskip("jupyterlab_gpupool", reason="make test installs ./labextension")

from jupyterlab_gpupool import snapshot as views
from jupyterlab_gpupool.localgpu import LocalGPU
from jupyterlab_gpupool.widget import render


def lease(**over):
    base = {
        "id": "L1",
        "server": "",
        "offer": "a100-1g",
        "state": "active",
        "model": "A100-80GB",
        "node": "n1",
        "granted": "2026-01-01T10:00:00Z",
        "activated": "2026-01-01T10:00:05Z",
        "units": 1 / 7,
        "resize_of": None,
        "slots": [
            {
                "gpu": "GPU-1",
                "kind": "mig",
                "profile": "1g.10gb",
                "start": 0,
                "milli": None,
                "mig_uuid": "MIG-a",
            }
        ],
        "reclaim": None,
    }
    return {**base, **over}


@pytest.mark.parametrize(
    ("le", "label", "mib"),
    [
        (lease(), "A100 1g.10gb", 10240),
        (lease(model="H100-80GB", slots=[{"gpu": "G", "kind": "gpu"}]), "H100", 81920),
        (lease(model="H100-80GB", slots=[{"gpu": "G", "kind": "gpu"}] * 2), "2× H100", 163840),
        (lease(model="T4", slots=[{"gpu": "G", "kind": "shared", "milli": 250}]), "¼ T4", None),
        (
            lease(model="T4-16GB", slots=[{"gpu": "G", "kind": "shared", "milli": 250}]),
            "¼ T4",
            4096,
        ),
        (lease(state="queued"), "CPU only", None),
        (None, "CPU only", None),
    ],
)
def test_device_label_and_memory(le, label, mib):
    assert views.device_label(le) == label
    assert views.memory_total_mib(le) == mib


@pytest.mark.parametrize(
    ("now", "period", "end"),
    [
        (datetime(2026, 3, 18, 15, 30), "day", datetime(2026, 3, 19)),
        (datetime(2026, 3, 18, 15, 30), "week", datetime(2026, 3, 23)),  # a Wednesday → Monday
        (datetime(2026, 3, 23, 0, 0), "week", datetime(2026, 3, 30)),
        (datetime(2026, 12, 31, 23, 59), "month", datetime(2027, 1, 1)),
        (datetime(2026, 1, 31, 12, 0), "month", datetime(2026, 2, 1)),
    ],
)
def test_the_budget_resets_where_the_pool_starts_the_next_period(now, period, end):
    from jupyterhub_gpupool.pool.quota import period_start

    assert views.period_end(now, period) == end
    assert period_start(end, period) == end  # the pool's next period starts there


def test_which_lease_a_server_runs_on():
    old = lease(state="released")
    new = lease(id="L2", offer="a100-3g", resize_of="L1")
    # the environment's lease is held: it wins, a resize target is pending
    target = lease(id="L3", state="queued", resize_of="L1", position=2)
    assert views.pick_lease([lease(), target], "L1", "") == (lease(), target, False)
    # the environment's lease ended (the server restarted elsewhere): stale, the held one shows
    current, pending, stale = views.pick_lease([old, {**new, "resize_of": None}], "L1", "")
    assert current["id"] == "L2" and pending is None and stale
    # another server's lease is not this server's
    assert views.pick_lease([lease(server="other")], "L1", "") == (None, None, True)
    # a CPU-only server asking for a GPU: the request is pending
    asked = lease(id="L4", state="queued")
    assert views.pick_lease([asked], "", "") == (None, asked, False)


def test_resize_choices_leave_out_the_current_offer_and_say_why_not():
    offers = [
        {"name": "a100-1g", "units": 1 / 7, "available": 3, "queue_length": 0},
        {
            "name": "h100",
            "display_name": "H100",
            "units": 1,
            "available": 0,
            "queue_length": 2,
            "eta_seconds": 600,
            "quota_ok": False,
            "quota_reason": "over_limit",
        },
    ]
    (c,) = views.offer_choices(offers, "a100-1g", {"held_units": 1 / 7})
    assert c["name"] == "h100" and not c["fits"] and c["queue_length"] == 2
    assert c["why_not"] == "over your limit while you hold other GPUs"


def test_the_widget_says_what_the_panel_says():
    state = {
        "pool": {"ok": True},
        "lease": views.lease_view(lease(), {"a100-1g": {"display_name": "A100 · 1g"}}),
        "utilization": {"pool": [{"ts": 1, "util": None, "memory_used_mib": 2048}], "local": []},
        "local": {"available": False},
        "quota": views.quota_view(
            {
                "quota": {"guarantee": 1, "limit": 2, "budget": 10, "period": "week"},
                "held_units": 1 / 7,
                "used_unit_hours": 3.5,
            },
            datetime(2026, 3, 18),
        ),
        "notice": {
            "deadline": "2026-03-18T12:05:00Z",
            "reason": "idle 30 min",
            "action": "stop",
            "extendable": True,
        },
    }
    parts = render(state, now=datetime.fromisoformat("2026-03-18T12:00:00+00:00").timestamp())
    assert "A100 1g.10gb" in parts["lease"] and "MIG 1g.10gb on GPU-1" in parts["lease"]
    assert "2.0 GiB / 10.0 GiB" in parts["activity"] and "Utilization" not in parts["activity"]
    assert "3.5 of 10" in parts["quota"] and "resets 2026-03-23 00:00 UTC" in parts["quota"]
    unbudgeted = {**state["quota"], "budget": None, "used_unit_hours": 0.0}
    quota = render({**state, "quota": unbudgeted})["quota"]
    assert "0 used, no budget set" in quota and "of no budget" not in quota
    # the time too: a widget whose kernel went with the reclaim stays on the page as drawn
    assert "reclaimed at 12:05 UTC (in 5:00) because idle 30 min" in parts["notice"]
    assert "then your server will be stopped (open documents are saved first)" in parts["notice"]
    drain = {
        **state["notice"],
        "heading": "Node maintenance: this GPU's node is being drained",
        "keep": False,
        "why_not_kept": "It cannot be kept: its node is drained for maintenance",
    }
    notice = render({**state, "notice": drain}, now=0)["notice"]
    assert "<b>Node maintenance: this GPU&#x27;s node is being drained</b>" in notice
    assert "It cannot be kept: its node is drained for maintenance." in notice
    down = render({"pool": {"ok": False, "error": "the pool is away"}, "lease": None})
    assert "not answering" in down["lease"] and "CPU only" in down["lease"]


def test_local_nvml_reads_a_mig_device_by_its_uuid():
    from jupyterhub_gpupool.telemetry import simnvml

    machine = simnvml.configure(
        """
nodes:
  - name: n1
    gpus:
      - model: A100-80GB
        mig: {enabled: true, instances: [{profile: 1g.10gb, start: 0}]}
"""
    )
    local = LocalGPU("jupyterhub_gpupool.telemetry.simnvml")  # nvmlInit, as on a server
    gpu = machine.nvmlDeviceGetHandleByIndex(0)
    mig = machine.nvmlDeviceGetUUID(machine.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0))
    machine.add_process(mig, 3000)
    reading = local.read([mig, "MIG-not-there"])
    (dev,) = reading["devices"]
    assert dev["uuid"] == mig and dev["memory_used_mib"] >= 3000 and dev["processes"] == 1
    assert dev["util"] is None  # NVML has no utilization for MIG devices
    assert 9000 < dev["memory_total_mib"] <= 10240
    assert reading["available"] and "MIG-not-there" in reading["reason"]


def test_without_nvml_the_panel_says_why():
    missing = LocalGPU("no_such_nvml_module")
    assert not missing.available and "cannot be imported" in missing.reason
    assert missing.read(["GPU-1"]) == {"available": False, "reason": missing.reason, "devices": []}
    assert "switched off" in LocalGPU("").reason


def test_the_lab_settings_are_documented_and_work_without_a_hub(monkeypatch):
    from jupyterlab_gpupool.extension import GPUPoolLab

    traits = GPUPoolLab.class_own_traits(config=True)
    assert [n for n, t in traits.items() if not (t.help or "").strip()] == []
    for var in ("GPUPOOL_API_URL", "GPUPOOL_LEASE_ID", "JUPYTERHUB_API_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    lab = GPUPoolLab()
    assert (lab.api_url, lab.lease_id, lab.interval, lab.save_timeout) == ("", "", 5.0, 10.0)
    monkeypatch.setenv("GPUPOOL_API_URL", "http://pool/api/v1/")
    monkeypatch.setenv("GPUPOOL_LEASE_ID", "L1")
    assert (GPUPoolLab().api_url, GPUPoolLab().lease_id) == ("http://pool/api/v1/", "L1")


@pytest.mark.parametrize(
    ("api", "page"),
    [
        ("http://gpupool.ns.svc:8080/services/gpupool/api/v1/", "/services/gpupool/"),
        ("http://127.0.0.1:10101/hub-base/services/pool/api/v1", "/hub-base/services/pool/"),
        ("http://pool/api/v1/", ""),  # no prefix: the page cannot be named
        ("", ""),
    ],
)
def test_the_lab_names_the_pool_page_a_browser_asks_once_the_server_is_gone(monkeypatch, api, page):
    """The lab asks the pool's ``ended/<lease>`` page, on the hub's origin, how the lease ended
    (the state's ``page``): the service prefix of the API URL, or $GPUPOOL_PAGE_URL."""
    from jupyterlab_gpupool.extension import GPUPoolLab

    monkeypatch.delenv("GPUPOOL_PAGE_URL", raising=False)
    monkeypatch.setenv("GPUPOOL_API_URL", api)
    assert GPUPoolLab().page_url == page
    monkeypatch.setenv("GPUPOOL_PAGE_URL", "/other/")
    assert GPUPoolLab().page_url == "/other/"


def test_a_waiting_move_and_a_past_reclaim_name_the_offer_as_users_read_it():
    offers = {"a100-3g": {"display_name": "A100 · 3g.40gb slice"}}
    pending = {"id": "P1", "offer": "a100-3g", "state": "granted", "ready": True}
    assert views.pending_view(pending, offers)["offer_name"] == "A100 · 3g.40gb slice"
    # an offer the pool no longer lists keeps its id rather than nothing
    assert views.pending_view({**pending, "offer": "gone"}, offers)["offer_name"] == "gone"
    assert views.offer_name("a100-3g", offers) == "A100 · 3g.40gb slice"


def test_the_quota_view_carries_the_budget_action_the_panel_warns_with():
    """The panel's budget warning (``budgetWarning``, Jest) says what happens at 100 % from the
    quota's ``budget_action``; an older pool sends none, which reads as ``refuse``."""
    now = datetime(2026, 3, 18)
    stop = {"quota": {"budget": 10, "budget_action": "stop"}, "used_unit_hours": 9.0}
    assert views.quota_view(stop, now)["budget_action"] == "stop"
    assert views.quota_view({"quota": {"budget": 10}}, now)["budget_action"] == "refuse"
