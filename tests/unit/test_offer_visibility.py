"""Refusals never reveal an offer the caller may not use (issue 30): through the service's
real tornado app and writer (the hub's token check played by a fake), a user outside an offer's
groups who asks for it — to allocate, with a reason for approval, or to resize into — gets the
very answer a missing offer gets (status, code, field, the ``allowed`` list, the message with
the name swapped), and ``allowed`` names only offers the caller may use."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.service.scopes import USE
from tests.fakes import InProcessService, StoreClock, make_store

POOL: dict[str, Any] = {
    "nodes": [
        {
            "name": "h100",
            "cpu_milli": 64000,
            "memory_mib": 262144,
            "gpus": [{"model": "H100-80GB", "count": 4}],
        },
    ],
    "offers": [
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "vip-h100", "kind": "gpu", "models": ["H100-80GB"], "groups": ["vip"]},
        {
            "name": "vip-asked",
            "kind": "gpu",
            "count": 2,
            "models": ["H100-80GB"],
            "groups": ["vip"],
            "approval": "required",
        },
    ],
    "quotas": {"default": {"guarantee": 1, "limit": 4}},
}
MODELS: dict[str, dict[str, Any]] = {
    "alice": {"kind": "user", "name": "alice", "scopes": [f"{USE}!user=alice"], "groups": []},
    "vera": {"kind": "user", "name": "vera", "scopes": [f"{USE}!user=vera"], "groups": ["vip"]},
}
HIDDEN = ("vip-h100", "vip-asked")


@pytest.fixture
def svc(db_url: str, clock: StoreClock) -> Iterator[InProcessService]:
    upgrade(db_url)
    with InProcessService(make_store(db_url, clock, POOL), MODELS) as service:
        yield service


def answer(r: Any, name: str) -> tuple[int, dict[str, Any]]:
    """The refusal with the asked-for name replaced, to compare answers for two names."""
    error = dict(r.json()["error"])
    error["message"] = error["message"].replace(repr(name), "<name>")
    return r.status, error


def test_a_group_offer_is_as_missing_as_no_offer(svc):
    missing = answer(svc.call("alice", "POST", "allocations", {"offer": "nope"}), "nope")
    assert missing[0] == 422 and missing[1]["code"] == "unknown_offer"
    assert missing[1]["allowed"] == ["h100"]  # only what alice may use
    for name in HIDDEN:
        body = {"offer": name, "reason": "a paper"}
        r = svc.call("alice", "POST", "allocations", body)
        assert answer(r, name) == answer(
            svc.call("alice", "POST", "allocations", {"offer": "nope", "reason": "a paper"}),
            "nope",
        )
        assert answer(r, name) == missing
        # only the name she typed comes back, never another offer she may not use
        assert all(other not in r.body.decode() for other in HIDDEN if other != name)
    # resizing into it: the same answer as resizing into nothing
    lease = svc.call("alice", "POST", "allocations", {"offer": "h100"}).json()
    into_nothing = svc.call("alice", "POST", f"allocations/{lease['id']}/resize", {"offer": "nope"})
    for name in HIDDEN:
        r = svc.call("alice", "POST", f"allocations/{lease['id']}/resize", {"offer": name})
        assert answer(r, name) == answer(into_nothing, "nope")
        assert all(other not in r.body.decode() for other in HIDDEN if other != name)
    # the offers she lists do not name them either
    listed = svc.call("alice", "GET", "offers").json()
    assert [o["name"] for o in listed["items"]] == ["h100"]
    # a member is refused nothing of it, and sees them named
    assert svc.call("vera", "POST", "allocations", {"offer": "vip-h100"}).status == 201
    r = svc.call("vera", "POST", "allocations", {"offer": "nope", "server": "x"})
    assert r.json()["error"]["allowed"] == ["h100", "vip-h100", "vip-asked"]
