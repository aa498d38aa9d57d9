"""The pool map's headroom line and held node (issue 35) in real Chromium, against a real hub and
a pool service whose store reads the test's clock (:class:`~tests.fakes.ClockFile`).

The pool keeps two H100s free of borrowing (``borrowing: {keep_free: 2}``) on two nodes of four.
Five borrowed trainings leave three free; a 4-GPU training fits nowhere and, once it has
waited ``reserve_after``, holds the node with the most free GPUs. Two notebooks then
use the headroom, the refill gives one training its notice, and the line says one GPU is
missing; the training's slice is drawn under notice (the job's notice: its lease has none)
with the class's grace as its deadline, counted in the summary; the training stops and the
line, refreshed live (no reload), says the headroom is whole again. Nine hours on, the
waiter outranks notebooks: the held node's free GPUs leave the count. Every figure the test
expects is worked out from the scenario (what is kept, which lease sits where), and the line
must say what ``GET pool/map``'s ``headroom`` says. The held node is named in its heading, its
tree item's label and its slices' labels (not a colour).
With ``GPUPOOL_SCREENSHOTS=DIR`` the map is saved as ``admin-map-headroom.png``.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest

pytest.importorskip("playwright.sync_api")

from playwright.sync_api import expect

from tests.fakes import ClockFile, HubEnv, clocked_service_python, request, wait_until
from tests.fakes.panel import BASE, CHROMIUM, lease, log_in, prefix, shoot

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM}"),
]

KEEP = 2
#: The training class's grace: a refill's notice ends this long after its round.
GRACE = 120
GPUS = {"node-a": 4, "node-b": 4}
BIG = "4× H100 80GB"
#: The service's reserve_after (its default): a request waiting this long holds a node.
RESERVE_AFTER = 1800
#: Two nodes of four H100s; alice is guaranteed one GPU, the others borrow. A training only
#: waits for capacity (no preemption for waiters), so nothing but the refill gives notices.
POOL = {
    "nodes": [
        {
            "name": name,
            "cpu_milli": 64000,
            "memory_mib": 524288,
            "gpus": [{"model": "H100-80GB", "count": count}],
        }
        for name, count in GPUS.items()
    ],
    "offers": [
        {
            "name": "h100",
            "kind": "gpu",
            "count": 1,
            "models": ["H100-80GB"],
            "display_name": "1× H100 80GB",
        },
        {"name": "h100x4", "kind": "gpu", "count": 4, "models": ["H100-80GB"], "display_name": BIG},
    ],
    "quotas": {
        "default": {"guarantee": 0, "limit": 16},
        "users": {"alice": {"guarantee": 1, "limit": 2}},
    },
    "classes": {"training": {"grace": GRACE, "preempt_for_waiters": False}},
    "borrowing": {"keep_free": KEEP},
}


@dataclass
class Pool:
    hub: HubEnv
    clock: ClockFile


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    tmp = tmp_path_factory.mktemp("headroom")
    config = tmp / "pool.yaml"
    config.write_text(json.dumps(POOL))  # YAML reads JSON
    clock = ClockFile(tmp / "clock", time.time() + 60)
    env = HubEnv(
        tmp,
        f"sqlite:///{tmp}/pool.sqlite",
        config,
        users=("alice", "bob", "trainer", "admin"),
        base_url=BASE,
        service_args=(
            "--PoolService.decisions=thread",  # the store on the test's clock decides
            "--PoolService.reconcile_on_start=False",
            "--PoolService.reconcile_interval=0",
            "--PoolService.check_user_servers=False",
            "--PoolService.agent_timeout=0",
            "--PoolService.housekeeping_interval=1",  # the refill's round
            f"--PoolService.reserve_after={RESERVE_AFTER}",
        ),
        python=clocked_service_python(clock),
    )
    with env.running():
        yield Pool(env, clock)


def submit(hub: HubEnv, name: str, offer: str) -> dict:
    """A training job of ``trainer`` (no guarantee: it borrows), as ``job submit`` sends it."""
    token = hub.user_tokens.setdefault("trainer", hub.token("trainer"))
    body = {"offer": offer, "class": "training", "name": name, "command": ["python", "t.py"]}
    r = request("POST", f"{hub.api}/jobs", token, body)
    assert r.status == 201, r.body
    return r.json()  # type: ignore[no-any-return]


def runner(hub: HubEnv, job: dict, body: dict) -> dict:
    """The job runner's report (the agent's token)."""
    r = request("POST", f"{hub.api}/jobs/{job['id']}/status", hub.agent_token, body)
    assert r.status == 200, r.body
    return r.json()  # type: ignore[no-any-return]


def job_state(hub: HubEnv, job: dict) -> str:
    r = request("GET", f"{hub.api}/jobs/{job['id']}", hub.user_tokens["trainer"])
    assert r.status == 200, r.body
    return r.json()["state"]  # type: ignore[index,no-any-return]


def pool_map(hub: HubEnv) -> dict:
    r = request("GET", f"{hub.api}/pool/map", hub.token("admin"))
    assert r.status == 200, r.body
    return r.json()  # type: ignore[no-any-return]


def headroom(hub: HubEnv) -> dict:
    return pool_map(hub)["headroom"]  # type: ignore[no-any-return]


def free_of(nodes: list[str]) -> dict[str, int]:
    """Free GPUs per node with one GPU held for each of ``nodes`` (a lease's node)."""
    used = Counter(nodes)
    return {node: count - used[node] for node, count in GPUS.items()}


def model_room(free: int) -> dict:
    """``headroom.models`` when ``free`` H100s are counted."""
    short = max(0, KEEP - free)
    return {"model": "H100-80GB", "keep_free": KEEP, "free_units": free, "short_units": short}


def line(free: int, held: str | None = None) -> str:
    """The headroom line for ``free`` counted H100s and the ``held`` part (None: none)."""
    room = f"H100-80GB {free} free of {KEEP} kept"
    if free < KEEP:
        room += f", {KEEP - free} missing (refill notices out)"
    return f"Headroom: keep_free {KEEP} · {room} · {held or 'no node held'}"


def held_after(remembered: str, live: list[tuple[str, bool]]) -> str:
    """The node the 4-GPU waiter holds once ``live`` (node, borrowed) 1-GPU leases run, by the
    documented rule (``explanation/concepts.md``): a node can serve it while four of its GPUs are
    free or borrowed; the remembered node is kept while it can and no other node that can is
    less pinned (GPUs held within guarantee), else the least pinned that can."""
    pinned = {n: sum(1 for at, borrowed in live if at == n and not borrowed) for n in GPUS}
    can = [n for n in GPUS if GPUS[n] - pinned[n] >= 4]
    assert can, (live, pinned)  # the scenario keeps a node the waiter could use
    if remembered in can and pinned[remembered] <= min(pinned[n] for n in can):
        return remembered
    return min(can, key=lambda n: (pinned[n], list(GPUS).index(n)))


def test_the_headroom_line_and_the_held_node(pool: Pool, browser: Any) -> None:
    hub, clock = pool.hub, pool.clock
    trainings = []
    for n in range(5):
        clock.advance(1)
        trainings.append(submit(hub, f"train-{n}", "h100"))
        assert trainings[-1]["state"] == "granted", trainings[-1]
        runner(hub, trainings[-1], {"state": "running", "pid": 100 + n})
    big = submit(hub, "big", "h100x4")  # five of eight GPUs held: no node has four free
    assert big["state"] == "queued", big
    r = request("GET", f"{hub.api}/allocations/{big['lease_id']}", hub.spawner_token)
    assert r.json()["reason"] == "no_capacity", r.body  # type: ignore[index]
    queued_at = clock.now
    free = free_of([t["node"] for t in trainings])
    assert sum(free.values()) == 3 and max(free.values()) < 4, free

    admin = log_in(hub, browser, "admin")
    admin.goto(prefix(hub) + "admin/")
    room = admin.locator("#map-headroom")
    expect(room).to_have_text(line(3))
    assert headroom(hub) == {
        "keep_free": f"keep_free {KEEP}",
        "models": [model_room(3)],
        "held": [],
    }
    admin.evaluate("window.sameDocument = true")  # gone if the page reloads

    # past reserve_after the waiter holds the node with the most free GPUs (the first in
    # node order on a tie)
    clock.advance(RESERVE_AFTER + 1)
    node = max(GPUS, key=lambda n: (free[n], -list(GPUS).index(n)))
    held = f"node {node} held for trainer's {BIG} (waiting 30 min)"
    expect(room).to_have_text(line(3, held), timeout=60_000)
    (x,) = headroom(hub)["held"]
    since = datetime.fromisoformat(x.pop("waiting_since").replace("Z", "+00:00"))
    assert abs(since.timestamp() - queued_at) < 1e-3
    assert x == {
        "node": node,
        "request": big["lease_id"],
        "user": "trainer",
        "offer": "h100x4",
        "out_of_count": False,  # it has not aged past the notebooks' priority yet
    }
    # the mark is words, not a colour: in the heading, the tree item's name, each slice's label
    mark = f"held for trainer's {BIG}"
    item = admin.get_by_role("treeitem", name=f"node {node}, {mark}", exact=True)
    expect(item.locator("h4")).to_have_text(f"{node} ({mark})")
    other = next(n for n in GPUS if n != node)
    expect(admin.get_by_role("treeitem", name=f"node {other}", exact=True)).to_have_count(1)
    slices = item.locator(".slice[role=treeitem]")
    expect(slices).to_have_count(GPUS[node])
    for i in range(GPUS[node]):
        expect(slices.nth(i)).to_have_attribute("aria-label", re.compile(f"node {mark}"))
    slices.first.focus()  # the keyboard's way in: the detail line reads the label
    expect(admin.locator("#map-detail")).to_contain_text(f"node {mark}")

    # two notebooks (never preempted) take from the headroom; the refill's round gives one
    # borrowed training its notice, and one GPU is missing until it stops
    notebooks = [lease(hub, user, "h100", "nb") for user in ("alice", "bob")]
    assert [nb["state"] for nb in notebooks] == ["active", "active"], notebooks
    # the hold stays only while its node could still serve the waiter and no node that could
    # is less pinned (units within guarantee): notebooks landing there move it
    leases = pool_map(hub)["leases"]
    live = [(t["node"], leases[t["lease_id"]]["borrowed"]) for t in trainings]
    live += [(nb["node"], leases[nb["id"]]["borrowed"]) for nb in notebooks]
    node = held_after(node, live)
    held = f"node {node} held for trainer's {BIG} (waiting 30 min)"
    expect(room).to_have_text(line(1, held), timeout=60_000)
    assert headroom(hub)["models"] == [model_room(1)]
    noticed = wait_until(
        lambda: [t for t in trainings if job_state(hub, t) == "preempting"],
        what="the refill's notice to a borrowed training",
    )[0]
    # the youngest training, wherever it runs: the held node still counts (its waiter has not
    # aged past a notebook's ask), so what a notice frees there is headroom too
    assert noticed is trainings[-1], (noticed, trainings[-1])
    # its notice is the job's, not its lease's: the map says it in the lease's entry, with the
    # deadline its class's grace gives from the refill's round (the clock stood still since)
    refilled_at = clock.now
    r = request("GET", f"{hub.api}/allocations/{noticed['lease_id']}", hub.token("admin"))
    assert r.json()["reclaim"] is None, r.body  # type: ignore[index]
    told = request("GET", f"{hub.api}/jobs/{noticed['id']}", hub.user_tokens["trainer"]).json()
    entry = pool_map(hub)["leases"][noticed["lease_id"]]
    assert entry["notice"] is None
    notice = entry["preempting"]
    assert notice["reason"] == told["reason"] and f"keeps {KEEP} H100-80GB" in notice["reason"]
    deadline = datetime.fromisoformat(notice["deadline"].replace("Z", "+00:00")).timestamp()
    assert abs(deadline - (refilled_at + GRACE)) < 1e-3, (notice, refilled_at)
    # drawn under notice like any other: counted in the summary, said in its slice's label
    summary = admin.locator("#map-summary")
    expect(summary).to_contain_text(", 1 under notice,", timeout=60_000)
    cell = admin.locator(".slice[role=treeitem].reclaiming")
    expect(cell).to_have_count(1)
    killed_at = datetime.fromtimestamp(refilled_at + GRACE, timezone.utc)
    said = f"preemption notice: killed at {killed_at:%Y-%m-%d %H:%M:%S} UTC ({notice['reason']})"
    expect(cell).to_have_attribute("aria-label", re.compile(re.escape(said)))
    holder = f"held by job {noticed['name']} (training) of trainer"
    expect(cell).to_have_attribute("aria-label", re.compile(re.escape(holder)))
    cell.focus()  # the detail line reads it too
    expect(admin.locator("#map-detail")).to_contain_text(said)
    shoot(admin, "admin-map-headroom")
    # the lease table says it by the lease's state (the map's page stays as it is)
    table = admin.context.new_page()
    table.goto(prefix(hub) + "admin/leases")
    row = table.locator(f"#leases tr[data-lease='{noticed['lease_id']}']")
    until = datetime.fromtimestamp(refilled_at + GRACE, timezone.utc).strftime("%Y-%m-%d %H:%M")
    expect(row.locator(".preempting")).to_have_text(
        f"preemption notice, until {until} UTC ({notice['reason']})"
    )
    expect(row.get_by_role("button", name="Cancel notice…")).to_have_count(0)  # not a lease's
    table.close()

    # it stops at its checkpoint: its GPU is free again and the line says so, live
    assert runner(hub, noticed, {"state": "exited", "exit_code": 143})["state"] == "preempted"
    expect(room).to_have_text(line(KEEP, held), timeout=60_000)
    assert headroom(hub)["models"] == [model_room(KEEP)]
    expect(summary).to_contain_text(", 0 under notice,")
    assert admin.evaluate("window.sameDocument") is True

    # nine hours on the waiter outranks a notebook's ask: the held node's free GPUs are its
    # alone, out of the headroom's count
    clock.advance(8.5 * 3600)
    live = [t["node"] for t in trainings if t is not noticed] + [nb["node"] for nb in notebooks]
    counted = KEEP - free_of(live)[node]
    out = (
        f"node {node} held for trainer's {BIG} (waiting 9 h 00 min), its free GPUs out of the count"
    )
    expect(room).to_have_text(line(counted, out), timeout=60_000)
    got = headroom(hub)
    assert got["models"] == [model_room(counted)]
    assert got["held"][0]["node"] == node and got["held"][0]["out_of_count"] is True
    assert admin.evaluate("window.sameDocument") is True
    admin.context.close()
