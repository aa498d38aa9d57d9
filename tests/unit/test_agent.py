"""The node agent's loop, driven by a fake clock, a fake reader and an in-memory transport.

No real time passes and no socket opens: the clock only moves when the loop sleeps, so backoff,
batching and queue bounds are checked exactly, without timing assertions.
"""

from __future__ import annotations

import itertools
import logging

import pytest

from jupyterhub_gpupool.telemetry.agent import NodeAgent, inventory_hash
from tests.fakes import AGENT_API as API
from tests.fakes import FakeReader, FakeService, SecondsClock, make_agent, run_for


def test_inventory_sent_at_start_then_only_when_it_changes():
    reader = FakeReader(gpus=2, slices=0)
    loop, clock, service = make_agent(reader, inventory_interval=10)
    run_for(loop, clock, 0.5)
    assert [c.method for c in service.calls] == ["PUT", "POST"]  # inventory before samples
    assert service.calls[0].url == API + "nodes/node-1/inventory"
    assert service.calls[0].body == reader.inventory()

    run_for(loop, clock, 120)  # 12 inventory checks, nothing changed
    assert len(service.puts()) == 1
    assert loop.stats.inventories == 1

    reader.slices = 3  # a MIG reconfiguration
    run_for(loop, clock, 11)
    assert len(service.puts()) == 2
    assert service.puts()[-1].body == reader.inventory()
    run_for(loop, clock, 60)
    assert len(service.puts()) == 2


def test_samples_are_batched_and_delivered_in_order():
    reader = FakeReader(gpus=8, slices=7)
    loop, clock, service = make_agent(reader, interval=5, flush_interval=20)
    run_for(loop, clock, 100.5)
    posts = service.posts()
    # a batch at start, then one per 20 s holding four 5 s rounds of 56 samples
    assert len(posts) == 6
    assert all(len(p.body["samples"]) == 4 * 56 for p in posts[1:])
    stamps = [s["ts"] for s in service.delivered()]
    assert stamps == sorted(stamps)
    assert len(stamps) == reader.reads * 56 == loop.stats.sent
    assert all(p.url == API + "nodes/node-1/samples" for p in posts)


def test_a_large_queue_goes_out_in_bounded_batches():
    reader = FakeReader(gpus=10)
    loop, clock, service = make_agent(reader, batch_size=25, flush_interval=100)
    run_for(loop, clock, 5)  # the first round goes out at once
    run_for(loop, clock, 100)  # then 20 rounds (200 samples) wait for the flush
    sizes = [len(p.body["samples"]) for p in service.posts()]
    assert sizes[0] == 10 and sizes[1:] == [25] * 8
    assert not loop.queue


def test_service_away_backs_off_to_the_cap_bounds_the_queue_and_catches_up():
    reader = FakeReader(gpus=4)
    loop, clock, service = make_agent(
        reader, interval=5, max_queue=200, backoff_base=1, backoff_max=60, batch_size=100
    )
    run_for(loop, clock, 1)
    service.status = None  # the service goes away
    seen_max = 0

    def check() -> None:
        nonlocal seen_max
        seen_max = max(seen_max, len(loop.queue))

    run_for(loop, clock, 3000, check)
    attempts = [c.t for c in service.calls if c.status is None]
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[0] < 3  # starts fast …
    assert all(g <= 60 for g in gaps)  # … never waits more than the cap …
    assert max(gaps) >= 30  # … and reaches it (jitter takes at most half off)
    assert len(set(gaps[-10:])) > 1  # jittered, not a fixed beat
    assert loop.stats.errors == len(attempts)

    assert seen_max == 200 == len(loop.queue)  # bounded
    produced = reader.reads * 4
    delivered_before = len(service.delivered())
    assert loop.stats.dropped == produced - delivered_before - 200

    service.status = 200  # back
    run_for(loop, clock, 70)
    delivered = service.delivered()
    stamps = [s["ts"] for s in delivered]
    assert stamps == sorted(stamps)  # oldest kept sample first, nothing reordered
    assert len(delivered) + loop.stats.dropped == reader.reads * 4  # nothing else lost
    assert not loop.queue and loop.failures == 0


def test_5xx_counts_as_away():
    loop, clock, service = make_agent(backoff_max=8)
    service.status = 503
    run_for(loop, clock, 200)
    assert loop.stats.errors == len(service.calls) > 10
    assert loop.stats.sent == 0
    service.status = 200
    run_for(loop, clock, 10)
    assert loop.stats.sent > 0 and loop.stats.inventories == 1


def test_forbidden_token_is_logged_once_and_retried_slowly(caplog):
    caplog.set_level(logging.DEBUG, "jupyterhub_gpupool")
    loop, clock, service = make_agent(denied_retry_interval=60)
    service.status = 403
    run_for(loop, clock, 3600)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "the agent token is not allowed: 403 nope" in errors[0].getMessage().lower()
    assert len(service.calls) == 60  # once a minute (t = 0 … 3540 s), not every tick
    assert all(c.method == "PUT" for c in service.calls)  # samples wait for the inventory
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1

    service.status = 200  # the admin fixed the role
    run_for(loop, clock, 61)
    assert loop.stats.inventories == 1 and loop.stats.sent > 0


def test_unknown_token_401_is_the_same_single_line(caplog):
    caplog.set_level(logging.INFO, "jupyterhub_gpupool")
    loop, clock, service = make_agent()
    service.status = 401
    run_for(loop, clock, 1000)
    assert len(service.calls) > 10
    assert [r.getMessage()[:38] for r in caplog.records if r.levelno >= logging.ERROR] == [
        "The agent token is not allowed: 401 no"
    ]


def test_refused_samples_are_dropped_not_retried_and_inventory_is_resent(caplog):
    loop, clock, service = make_agent(inventory_interval=10)
    run_for(loop, clock, 1)
    service.post_status = 422  # e.g. an admin removed this node from the pool
    run_for(loop, clock, 30)
    refused = [c for c in service.calls if c.status == 422]
    assert len(refused) == 6
    assert loop.stats.rejected == sum(len(c.body["samples"]) for c in refused)
    assert loop.stats.errors == 0 and not loop.queue
    # re-sent so the service knows the GPUs again: at each inventory check, never more often
    assert loop.stats.inventories == 1 + 3
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    service.post_status = None
    run_for(loop, clock, 11)
    assert loop.stats.sent > 2 and loop.stats.rejected == 12
    resent = loop.stats.inventories
    run_for(loop, clock, 100)
    assert loop.stats.inventories == resent  # accepted samples: no more re-sends


def test_refused_inventory_is_not_resent_until_it_changes(caplog):
    reader = FakeReader()
    loop, clock, service = make_agent(reader, inventory_interval=10)
    service.status = 422
    run_for(loop, clock, 100)
    assert len(service.puts()) == 1
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
    service.status = 200
    reader.slices = 2
    run_for(loop, clock, 11)
    assert len(service.puts()) == 2 and loop.stats.inventories == 1


def test_reader_failures_are_counted_and_logged_once_per_error(caplog):
    reader = FakeReader()
    loop, clock, _ = make_agent(reader)
    reader.fail = RuntimeError("NVML_ERROR_GPU_IS_LOST")
    run_for(loop, clock, 100)
    assert loop.stats.read_errors == 20
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "GPU_IS_LOST" in warnings[0].getMessage()
    reader.fail = None
    run_for(loop, clock, 10)
    assert loop.stats.sent > 0


def test_counters_are_logged_at_a_low_rate(caplog):
    caplog.set_level(logging.INFO, "jupyterhub_gpupool")
    loop, clock, _ = make_agent(stats_interval=300)
    run_for(loop, clock, 1000)
    lines = [r.getMessage() for r in caplog.records if "dropped=" in r.getMessage()]
    assert len(lines) == 3
    assert "sent=" in lines[-1] and "errors=0" in lines[-1]


def test_backoff_is_capped_and_jittered():
    loop, _, _ = make_agent(backoff_base=1, backoff_max=60, backoff_jitter=0.5)
    delays = [loop.backoff(n) for n in range(1, 200)]
    assert all(0 < d <= 60 for d in delays)
    assert delays[0] <= 1 and min(delays[20:]) >= 30
    assert len(set(delays[20:])) > 100


def test_inventory_hash_ignores_key_order():
    a = {"gpus": [{"uuid": "GPU-0", "model": "T4"}], "cpu_milli": 1}
    b = {"cpu_milli": 1, "gpus": [{"model": "T4", "uuid": "GPU-0"}]}
    assert inventory_hash(a) == inventory_hash(b)
    assert inventory_hash(a) != inventory_hash({**a, "cpu_milli": 2})


def test_loop_rejects_settings_that_cannot_work():
    with pytest.raises(ValueError):
        make_agent(interval=0)
    with pytest.raises(ValueError):
        make_agent(batch_size=10_001)


# --- the application --------------------------------------------------------------------------


def test_every_agent_trait_is_documented():
    traits = NodeAgent.class_own_traits(config=True)
    assert [n for n, t in traits.items() if not (t.help or "").strip()] == []


def test_command_line_and_environment(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUPOOL_AGENT_TOKEN", raising=False)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "from-hub-env")
    app = NodeAgent()
    app.initialize(
        ["--service-url=http://hub:8000/services/gpupool/", "--node=gpu-7", "--interval=2"]
    )
    assert app.api_url == "http://hub:8000/services/gpupool/api/v1/"
    assert (app.node, app.interval, app.api_token, app.source) == (
        "gpu-7",
        2.0,
        "from-hub-env",
        "nvml",
    )
    loop = app.make_loop(FakeReader(), transport=FakeService(SecondsClock()))
    assert loop.interval == 2.0 and loop.flush_interval == 2.0
    assert loop.headers["Authorization"] == "token from-hub-env"

    monkeypatch.setenv("GPUPOOL_AGENT_TOKEN", "agent-specific")
    app = NodeAgent()
    app.initialize(["--service-url=http://pool:10101/services/gpupool/api/v1", "--source=sim"])
    assert app.api_url == "http://pool:10101/services/gpupool/api/v1/"
    assert app.api_token == "agent-specific" and app.source == "sim"


def test_missing_url_or_token_is_a_clear_exit(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for var in ("GPUPOOL_AGENT_TOKEN", "JUPYTERHUB_API_TOKEN", "GPUPOOL_SERVICE_URL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit, match="service-url"):
        NodeAgent().initialize([])
    with pytest.raises(SystemExit, match="custom:gpupool:agent"):
        NodeAgent().initialize(["--service-url=http://x/"])
