"""An administrator cancels a reclaim notice over HTTP, through the service's real tornado app
and writer (the hub's token check played by a fake): only admins may, the route answers the
lease under no notice, a missing notice is a 409 naming it, a bad body a 422, and the user is
told through the service's ``notify_hook`` (also of the drain notices an uncordon withdraws,
and the webhook example words it)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.service.scopes import ADMIN, SPAWN, USE
from tests.fakes import InProcessService, StoreClock, make_store, wait_until

MODELS: dict[str, dict[str, Any]] = {
    "alice": {"kind": "user", "name": "alice", "scopes": [f"{USE}!user=alice"], "groups": []},
    "spawner": {"kind": "service", "name": "gpupool-spawner", "scopes": [SPAWN]},
    "root": {"kind": "user", "name": "root", "scopes": [ADMIN], "groups": []},
}


class Heard:
    """A notify_hook that keeps what it was told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, event: str, lease: dict[str, Any], details: dict[str, Any]) -> None:
        with self.lock:
            self.events.append((event, lease["id"], details))

    def seen(self) -> list[tuple[str, str, dict[str, Any]]]:
        with self.lock:
            return list(self.events)


@pytest.fixture
def heard() -> Heard:
    return Heard()


@pytest.fixture
def svc(db_url: str, clock: StoreClock, heard: Heard) -> Iterator[InProcessService]:
    upgrade(db_url)
    service = InProcessService(make_store(db_url, clock), MODELS)
    service.svc.notify_hook = heard
    with service:
        yield service


def held(svc: InProcessService, server: str = "") -> dict[str, Any]:
    r = svc.call(
        "spawner", "POST", "allocations", {"user": "alice", "server": server, "offer": "h100"}
    )
    assert r.status == 201, r.body
    r = svc.call("alice", "POST", f"allocations/{r.json()['id']}/keepalive")
    assert r.status == 200, r.body
    return r.json()


def test_only_an_admin_cancels_a_notice_and_the_user_is_told(svc, heard):
    lease = held(svc)
    path = f"allocations/{lease['id']}/notice/cancel"
    r = svc.call("root", "POST", path, {})
    assert r.status == 409 and r.json()["error"]["code"] == "no_notice"
    r = svc.call("root", "POST", f"allocations/{lease['id']}/reclaim", {"grace": 600})
    assert r.status == 200 and r.json()["state"] == "reclaiming"
    for who in ("alice", "spawner"):
        r = svc.call(who, "POST", path, {})
        assert r.status == 403 and r.json()["error"]["code"] == "forbidden"
    r = svc.call("root", "POST", path, {"reason": 7})
    assert r.status == 422 and r.json()["error"]["field"] == "reason"
    r = svc.call("root", "POST", path, {"reason": "false alarm"})
    assert r.status == 200, r.body
    assert r.json()["state"] == "active" and r.json()["reclaim"] is None
    wait_until(lambda: [e[0] for e in heard.seen()] == ["notice-cancelled"], what="the hook")
    _event, lease_id, details = heard.seen()[0]
    assert lease_id == lease["id"]
    assert details == {"for": "user", "by": "root", "reason": "false alarm"}
    me = svc.call("alice", "GET", "users/me").json()
    assert me["notices"] == []
    audit = svc.call("root", "GET", f"events?lease={lease['id']}&kind=reclaim-cancelled").json()
    [entry] = audit["items"]
    assert entry["actor"] == "user:root" and entry["data"]["by_admin"]


def test_an_uncordon_withdraws_drain_notices_and_tells_each_user(svc, heard, clock):
    lease = held(svc)
    deadline = (clock() + timedelta(hours=2)).isoformat() + "Z"
    r = svc.call("root", "POST", f"nodes/{lease['node']}/drain", {"deadline": deadline})
    assert r.status == 200 and r.json()["noticed"] == 1
    r = svc.call("root", "POST", f"nodes/{lease['node']}/uncordon", {})
    assert r.status == 200, r.body
    assert r.json()["withdrawn"] == [lease["id"]] and not r.json()["draining"]
    wait_until(lambda: heard.seen(), what="the hook")
    [(event, lease_id, details)] = heard.seen()
    assert (event, lease_id) == ("notice-cancelled", lease["id"])
    assert details["reason"] == f"the node {lease['node']} is back in service"
    assert svc.call("alice", "GET", f"allocations/{lease['id']}").json()["state"] == "active"


def test_the_webhook_example_words_a_cancelled_notice():
    from jupyterhub_gpupool.reclaim.hooks import message

    lease = {"user": "alice", "offer": "h100"}
    assert message("notice-cancelled", lease, {"by": "root", "reason": "false alarm"}) == (
        "alice: root withdrew the reclaim notice on your GPU (h100); you keep it: false alarm."
    )
