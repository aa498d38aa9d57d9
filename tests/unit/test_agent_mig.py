"""The agent loop applying the service's dynamic-MIG plan (fake clock, reader and transport)."""

from __future__ import annotations

import json
from typing import Any

from tests.fakes import AGENT_T0, FakeReader, FakeService, SecondsClock, make_agent, run_for

GPU = "GPU-0"
CREATE = {"op": "create", "gpu": GPU, "profile": "1g.10gb", "start": 6}


class MigReader(FakeReader):
    """A fake node whose MIG layout follows the actions applied to it."""

    def __init__(self, refuse: str | None = None) -> None:
        super().__init__(gpus=1)
        self.layout: dict[int, str] = {}
        self.applied: list[dict[str, Any]] = []
        self.refuse = refuse

    def inventory(self) -> dict[str, Any]:
        inv = super().inventory()
        inv["gpus"][0]["mig"] = {
            "enabled": True,
            "dynamic": True,
            "instances": [
                {"profile": p, "start": s, "uuid": f"MIG-{s}", "processes": 0}
                for s, p in sorted(self.layout.items())
            ],
        }
        return inv

    def apply_mig_plan(self, actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for a in actions:
            self.applied.append(a)
            if self.refuse:
                out.append({"ok": False, "error": self.refuse, "mig_uuid": None})
            elif a["op"] == "create":
                self.layout[a["start"]] = a["profile"]
                out.append({"ok": True, "error": None, "mig_uuid": f"MIG-{a['start']}"})
            else:
                self.layout.pop(a["start"], None)
                out.append({"ok": True, "error": None, "mig_uuid": None})
        return out


class PlanningService(FakeService):
    """Answers samples with a plan until the node reported a result for it."""

    def __init__(self, clock: SecondsClock, plan: list[dict[str, Any]]) -> None:
        super().__init__(clock)
        self.plan = plan

    async def __call__(self, method: str, url: str, headers: dict[str, str], body: bytes):
        status, answer = await super().__call__(method, url, headers, body)
        if url.endswith("/mig-results") and status == 200:
            self.plan = []
            return status, b'{"accepted": 1}'
        if url.endswith("/samples") and status == 200:
            return status, json.dumps({"accepted": 1, "mig_plan": self.plan}).encode()
        return status, answer


def make_planned(reader: MigReader, plan: list[dict[str, Any]], **kw: Any):
    loop, clock, _ = make_agent(reader, **kw)
    service = PlanningService(clock, plan)
    loop.transport = service
    return loop, clock, service


def test_the_plan_is_applied_reported_and_the_inventory_sent_at_once():
    reader = MigReader()
    loop, clock, service = make_planned(reader, [CREATE], interval=5.0)
    run_for(loop, clock, 1.0)
    assert reader.applied == [CREATE]  # once, although the plan came with the first samples
    calls = [(c.method, c.url.rsplit("/", 1)[1]) for c in service.calls]
    assert calls == [
        ("PUT", "inventory"),
        ("POST", "samples"),
        ("POST", "mig-results"),
        ("PUT", "inventory"),
    ]
    results = service.calls[2].body["results"]
    assert results == [{**CREATE, "ok": True, "error": None, "mig_uuid": "MIG-6"}]
    instances = service.calls[3].body["gpus"][0]["mig"]["instances"]
    assert [(i["profile"], i["start"], i["uuid"]) for i in instances] == [("1g.10gb", 6, "MIG-6")]
    assert loop.stats.mig_actions == 1 and loop.stats.mig_failures == 0
    # the next round: nothing more to do
    run_for(loop, clock, 10.0)
    assert reader.applied == [CREATE]


def test_failures_are_reported_with_the_nvml_error_and_logged(caplog):
    reader = MigReader(refuse="InsufficientResources")
    loop, clock, service = make_planned(reader, [CREATE])
    run_for(loop, clock, 1.0)
    (report,) = [c for c in service.calls if c.url.endswith("/mig-results")]
    assert report.body["results"][0]["error"] == "InsufficientResources"
    assert loop.stats.mig_failures == 1
    assert any("failed: InsufficientResources" in r.getMessage() for r in caplog.records)


def test_results_wait_for_a_service_that_is_away():
    reader = MigReader()
    loop, clock, service = make_planned(reader, [CREATE], backoff_base=1.0, backoff_max=2.0)

    async def away_for_results(method, url, headers, body):
        if url.endswith("/mig-results") and clock.now < AGENT_T0 + 10:
            service.calls.append(None)  # type: ignore[arg-type]
            raise ConnectionRefusedError("down")
        return await PlanningService.__call__(service, method, url, headers, body)

    loop.transport = away_for_results
    run_for(loop, clock, 30.0)
    assert reader.applied == [CREATE]  # applied once, reported once the service is back
    sent = [c for c in service.calls if c is not None and c.url.endswith("/mig-results")]
    assert len(sent) == 1 and sent[0].body["results"][0]["ok"] is True
    assert not loop._mig_results


def test_a_reader_that_cannot_change_mig_applies_nothing():
    loop, clock, _ = make_agent(FakeReader(gpus=1))
    service = PlanningService(clock, [CREATE])
    loop.transport = service
    run_for(loop, clock, 1.0)
    assert not [c for c in service.calls if c.url.endswith("/mig-results")]
    assert loop.stats.read_errors >= 1


def test_a_node_with_nothing_to_sample_still_asks_for_its_plan():
    class Empty(MigReader):
        def samples(self, now: float | None = None) -> list[dict[str, Any]]:
            return []  # MIG GPUs without instances have no devices to sample

    reader = Empty()
    loop, clock, service = make_planned(reader, [CREATE], interval=5.0)
    run_for(loop, clock, 1.0)
    asked = [c for c in service.calls if c.url.endswith("/samples")]
    assert asked and asked[0].body == {"samples": []}
    assert reader.applied == [CREATE]
