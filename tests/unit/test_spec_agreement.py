"""The server agrees with the spec on the points the outside probe found apart (issue 30):
every path name is at most 255 characters (400 naming it, on every method), epoch seconds may
carry a fraction (the lab extension sends them), a cluster that is no DNS label (empty
included) is a malformed argument (400), and a time past 9999 is refused. Through the
service's real app and writer; ``tests/integration/test_api_fuzz.py`` checks the same against
the whole spec (negative cases must be refused)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.service.scopes import ADMIN, AGENT, USE
from tests.fakes import InProcessService, StoreClock, make_store

MODELS: dict[str, dict[str, Any]] = {
    "root": {"kind": "user", "name": "root", "scopes": [ADMIN], "groups": []},
    "alice": {"kind": "user", "name": "alice", "scopes": [f"{USE}!user=alice"], "groups": []},
    "agent": {"kind": "service", "name": "gpupool-agent", "scopes": [AGENT]},
}
LONG = "n" * 256


@pytest.fixture
def svc(db_url: str, clock: StoreClock) -> Iterator[InProcessService]:
    upgrade(db_url)
    with InProcessService(make_store(db_url, clock), MODELS) as service:
        yield service


@pytest.mark.parametrize(
    ("who", "method", "path", "field"),
    [
        ("root", "GET", f"quotas/users/{LONG}", "name"),
        ("root", "DELETE", f"quotas/users/{LONG}", "name"),
        ("root", "PUT", f"quotas/users/{LONG}", "name"),
        ("agent", "GET", f"nodes/{LONG}/mig-plan", "name"),
        ("root", "POST", f"nodes/{LONG}/cordon", "name"),
        ("root", "GET", f"allocations/{LONG}", "lease_id"),
        ("alice", "GET", f"users/{LONG}", "name"),
    ],
)
def test_a_path_name_over_255_characters_is_400_naming_it(svc, who, method, path, field):
    body = {} if method in ("POST", "PUT") else None
    r = svc.call(who, method, path, body)
    assert r.status == 400, r.body
    error = r.json()["error"]
    assert error["code"] == "invalid_argument" and error["field"] == field
    assert "255" in error["message"]


def test_times_take_fractional_epoch_seconds_and_refuse_past_9999(svc):
    assert svc.call("root", "GET", "events?from=1700000000.25").status == 200
    assert svc.call("root", "GET", "events?from=1.5e9").status == 200
    r = svc.call("root", "GET", "events?from=253402300800")
    assert r.status == 400 and r.json()["error"]["field"] == "from"


@pytest.mark.parametrize("cluster", ["", "Not_A_Label", "a" * 64, "ok\n"])
def test_a_cluster_that_is_no_dns_label_is_a_malformed_argument(svc, cluster):
    from urllib.parse import quote

    r = svc.call("alice", "GET", f"offers?cluster={quote(cluster)}")
    assert r.status == 400, r.body
    assert r.json()["error"]["code"] == "invalid_argument"
    # a well-formed cluster the pool does not know is the pool's config: 422, naming the known
    r = svc.call("alice", "GET", "offers?cluster=elsewhere")
    assert r.status == 422 and r.json()["error"]["code"] == "unknown_cluster"
