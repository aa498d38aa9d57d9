"""Approvals over HTTP, through the service's real tornado app and writer (the hub's token
check played by a fake): a user's ask, the admins' list, approve and deny with their 403s, 409s
and 422s naming the field, the exception ceiling in the error body, withdrawal, the offers'
`approval` and `exception_ok`, and the service's notify_hook told of each step.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.service.scopes import ADMIN, SPAWN, USE
from tests.fakes import APPROVAL_POOL as POOL
from tests.fakes import InProcessService, StoreClock, make_store, wait_until

MODELS: dict[str, dict[str, Any]] = {
    "alice": {"kind": "user", "name": "alice", "scopes": [f"{USE}!user=alice"], "groups": []},
    "bob": {"kind": "user", "name": "bob", "scopes": [f"{USE}!user=bob"], "groups": []},
    "dana": {"kind": "user", "name": "dana", "scopes": [f"{USE}!user=dana"], "groups": []},
    "spawner": {"kind": "service", "name": "gpupool-spawner", "scopes": [SPAWN]},
    "root": {"kind": "user", "name": "root", "scopes": [ADMIN], "groups": []},
}


class Heard:
    """A notify_hook (async, as a webhook's would be) that keeps what it was told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    async def __call__(self, event: str, lease: dict[str, Any], details: dict[str, Any]) -> None:
        with self.lock:
            self.events.append((event, lease["id"], details))

    def kinds(self) -> list[str]:
        with self.lock:
            return [e[0] for e in self.events]


@pytest.fixture
def heard() -> Heard:
    return Heard()


@pytest.fixture
def svc(db_url: str, clock: StoreClock, heard: Heard) -> Iterator[InProcessService]:
    upgrade(db_url)
    service = InProcessService(make_store(db_url, clock, POOL), MODELS)
    service.svc.notify_hook = heard
    with service:
        yield service


def error(r: Any) -> dict[str, Any]:
    return r.json()["error"]


def test_an_ask_the_admins_list_approve_and_the_hook(svc, heard):
    r = svc.call("dana", "POST", "allocations", {"offer": "big"})
    assert r.status == 422 and error(r)["code"] == "missing_field"
    assert error(r)["field"] == "reason"
    r = svc.call("dana", "POST", "allocations", {"offer": "big", "reason": "paper"})
    assert r.status == 201, r.body
    ask = r.json()
    assert ask["state"] == "awaiting_approval" and ask["approval"]["reason"] == "paper"
    wait_until(lambda: heard.kinds() == ["approval-requested"], what="the admins were told")
    assert heard.events[0][2]["for"] == "admins"
    listed = svc.call("root", "GET", "allocations?state=awaiting_approval").json()
    assert [le["id"] for le in listed["items"]] == [ask["id"]]
    # only admins decide
    for who in ("dana", "spawner"):
        r = svc.call(who, "POST", f"allocations/{ask['id']}/approve", {})
        assert r.status == 403 and error(r)["code"] == "forbidden"
    r = svc.call("root", "POST", f"allocations/{ask['id']}/approve", {"duration": 10})
    assert r.status == 422 and error(r)["field"] == "duration"
    r = svc.call("root", "POST", f"allocations/{ask['id']}/approve", {"note": "ok"})
    assert r.status == 200 and r.json()["state"] == "granted"
    assert r.json()["approval"]["decided_by"] == "user:root"
    wait_until(lambda: heard.kinds()[-1:] == ["approved"], what="the user was told")
    assert heard.events[-1][2] == {"for": "user", "by": "root"}
    r = svc.call("root", "POST", f"allocations/{ask['id']}/approve", {})
    assert r.status == 409 and error(r)["code"] == "not_awaiting_approval"
    r = svc.call("root", "POST", f"allocations/{ask['id']}/deny", {"reason": "late"})
    assert r.status == 409 and error(r)["code"] == "not_awaiting_approval"


def test_deny_needs_a_reason_and_the_user_sees_it(svc, heard):
    ask = svc.call("dana", "POST", "allocations", {"offer": "big", "reason": "paper"}).json()
    r = svc.call("root", "POST", f"allocations/{ask['id']}/deny", {})
    assert r.status == 422 and error(r)["code"] == "missing_field"
    r = svc.call("root", "POST", f"allocations/{ask['id']}/deny", {"reason": "  "})
    assert r.status == 422 and error(r)["field"] == "reason"
    r = svc.call("root", "POST", f"allocations/{ask['id']}/deny", {"reason": "booked"})
    assert r.status == 200 and r.json()["release_reason"] == "denied"
    mine = svc.call("dana", "GET", f"allocations/{ask['id']}").json()
    assert mine["approval"]["note"] == "booked" and mine["state"] == "released"
    wait_until(lambda: heard.kinds()[-1:] == ["denied"], what="the user was told")


def test_an_exception_ask_the_ceiling_and_withdrawal(svc):
    offers = {o["name"]: o for o in svc.call("alice", "GET", "offers").json()["items"]}
    assert offers["big"]["approval"] == "required"
    assert offers["h100x2"]["quota_ok"] is False and offers["h100x2"]["exception_ok"] is True
    assert offers["h100x4"]["exception_ok"] is False
    r = svc.call(
        "alice", "POST", "allocations", {"offer": "h100x4", "reason": "x", "duration": 3600}
    )
    assert r.status == 422 and error(r)["code"] == "exceeds_exception_ceiling"
    assert error(r)["allowed"] == [2.0]
    body = {"offer": "h100x2", "reason": "deadline", "duration": 86400}
    ask = svc.call("alice", "POST", "allocations", body).json()
    assert ask["state"] == "awaiting_approval" and ask["exception"] is True
    # another user's request is not there for them, as for a missing one
    r = svc.call("bob", "DELETE", f"allocations/{ask['id']}")
    assert r.status == 404
    r = svc.call("alice", "DELETE", f"allocations/{ask['id']}")
    assert r.status == 200 and r.json()["release_reason"] == "withdrawn"
    r = svc.call("root", "POST", f"allocations/{ask['id']}/approve", {})
    assert r.status == 409 and "withdrawn" in error(r)["message"]


def test_bad_approval_bodies_name_the_field(svc):
    ask = svc.call("dana", "POST", "allocations", {"offer": "big", "reason": "paper"}).json()
    path = f"allocations/{ask['id']}/approve"
    for body, field in (
        ({"duration": "1h"}, "duration"),
        ({"offer": 3}, "offer"),
        ({"offer": "cpu"}, "offer"),
        ({"color": "red"}, "color"),
    ):
        r = svc.call("root", "POST", path, body)
        assert r.status == 422 and error(r)["field"] == field, (body, r.body)
    assert svc.call("root", "POST", "allocations/nope/approve", {}).status == 404


def test_the_webhook_example_words_the_approval_events():
    from jupyterhub_gpupool.reclaim.hooks import message

    lease = {"user": "dana", "offer": "big", "approval": {"reason": "paper", "note": None}}
    assert message("approval-requested", lease, {"for": "admins"}) == (
        "dana asks for big: paper. Approve or deny it on the admin panel's Approvals page."
    )
    assert message("approved", lease, {"by": "root"}) == (
        "dana: your request for big was approved by root."
    )
    denied = {**lease, "approval": {"reason": "paper", "note": "booked"}}
    assert message("denied", denied, {"by": "root"}) == (
        "dana: your request for big was denied by root: booked."
    )
