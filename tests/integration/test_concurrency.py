"""Concurrency: 8 client processes allocate and release through the real service at once.

Each client is a separate process speaking plain HTTP/1.1 (``http.client``, one keep-alive
connection) to the pool service with the spawner's token, against a pool small enough that
many requests queue. A checker process samples the live leases through the API (admin token)
and the live slots straight from the database while the load runs. At the end the test checks:

(a) no double grant — from the clients' own records (intervals during which a lease was held for
    certain), from every checker sample (API and SQL), and from an exact replay of the audit log
    (events are written in the allocation transaction, so their order is the commit order);
(b) no lost lease — every lease a client was given exists, every lease in the database belongs
    to a client, and once every client released everything nothing is queued or live;
(c) the audit log has exactly one ``granted`` event per lease ever granted and one ``released``
    per release.

A few POSTs (3 %) come from an impatient client that hangs up after 2 ms while the service still
handles the request. The ``kill -9`` variant also SIGKILLs the service after a third of the
requests and starts it again on the same database while the clients keep going. Either way a
request whose connection was cut may or may not have committed: the client treats it as unknown
and reconciles through ``GET allocations?user=`` (and, when its retry is answered 409
``already_allocated``, looks again: the attempt it gave up on was handled after all).

The service runs with ``reconcile_on_start=False``: the clients' users have no servers in the
hub, so reconciling with the hub would (correctly) release every lease behind the clients' backs.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing as mp
import queue
import random
import signal
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from tests.fakes import HubEnv, write_pool

CLIENTS = 8
ITERATIONS = 250  # allocate/release cycles per client
USERS_PER_CLIENT = 20
CLIENT_DEADLINE = 540.0  # seconds before a client gives up: only a hung service gets there
RETRY_SLEEP = 0.05
CHECK_EVERY = 0.25  # seconds between the checker's samples
IMPATIENT = 0.03  # share of POSTs whose client gives up after IMPATIENCE seconds
IMPATIENCE = 0.002

#: Small enough to be contended: 2 whole H100s, one dynamic-MIG A100, one shared T4.
POOL_YAML = """
nodes:
  - name: contended
    cpu_milli: 1000000
    memory_mib: 100000000
    gpus:
      - {model: H100-80GB, count: 2}
      - {model: A100-80GB, count: 1, mig: {enabled: true, dynamic: true}}
      - {model: T4, count: 1, sharing: shared}
offers:
  - {name: h100, kind: gpu, count: 1, models: [H100-80GB]}
  - {name: h100x2, kind: gpu, count: 2, models: [H100-80GB]}
  - {name: a100-1g, kind: mig, profile: 1g.10gb, models: [A100-80GB]}
  - {name: a100-3g, kind: mig, profile: 3g.40gb, models: [A100-80GB]}
  - {name: t4-quarter, kind: shared, fraction: 0.25, models: [T4]}
  - {name: t4-half, kind: shared, fraction: 0.5, models: [T4]}
"""
OFFERS = ("h100", "h100x2", "a100-1g", "a100-3g", "t4-quarter", "t4-half")
LIVE = ("granted", "active", "reclaiming")


# -- occupancy: what "double grant" means --------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """One piece of one GPU held by one lease."""

    gpu: str
    kind: str  # gpu | mig | shared
    milli: int = 1000
    profile: str | None = None
    start: int | None = None
    size: int = 0  # memory slices of a MIG instance

    def clashes(self, other: Piece) -> bool:
        """Two pieces of the same GPU that cannot be held at once (shares: see capacity)."""
        if self.gpu != other.gpu:
            return False
        if self.kind == "shared" and other.kind == "shared":
            return False
        if self.kind == "mig" and other.kind == "mig":
            a, b = self.start or 0, other.start or 0
            return a < b + other.size and b < a + self.size
        return True

    def __str__(self) -> str:
        if self.kind == "mig":
            return f"{self.gpu[:12]}/mig/{self.profile}@{self.start}"
        if self.kind == "shared":
            return f"{self.gpu[:12]}/shared/{self.milli}"
        return self.gpu[:12]


def mig_size(model: str | None, profile: str | None) -> int:
    """Memory slices a MIG profile occupies on ``model`` (1 when unknown: still catches equal)."""
    from jupyterhub_gpupool.pool.catalog import default_catalog

    if not model or not profile:
        return 1
    try:
        return default_catalog().model(model).profile(profile).memory_slices
    except Exception:
        return 1


def piece(
    gpu: str, kind: str, milli: int | None, profile: str | None, start: int | None, model: str
) -> Piece:
    """A Piece from a slot as the API or the database describe it."""
    size = mig_size(model, profile) if kind == "mig" else 0
    return Piece(gpu, kind, int(milli if milli is not None else 1000), profile, start, size)


class Occupancy:
    """Who holds what, per GPU; ``add`` returns every rule the new lease breaks."""

    def __init__(self) -> None:
        self.held: dict[str, list[tuple[str, Piece]]] = defaultdict(list)
        self.gpus_of: dict[str, set[str]] = defaultdict(set)

    def add(self, lease: str, pieces: Iterable[Piece]) -> list[str]:
        problems = []
        for p in pieces:
            holders = self.held[p.gpu]
            for other, q in holders:
                if p.clashes(q):
                    problems.append(f"{lease} holds {p} while {other} holds {q}")
            if p.kind == "shared":
                total = p.milli + sum(q.milli for _, q in holders if q.kind == "shared")
                if total > 1000:
                    problems.append(f"{lease} takes {p}: shares of {p.gpu} total {total} milli")
            holders.append((lease, p))
            self.gpus_of[lease].add(p.gpu)
        return problems

    def remove(self, lease: str) -> None:
        for gpu in self.gpus_of.pop(lease, ()):
            self.held[gpu] = [(le, p) for le, p in self.held[gpu] if le != lease]


def conflicts_in_snapshot(leases: Iterable[tuple[str, list[Piece]]]) -> list[str]:
    """Double grants among leases that were all live at one moment."""
    occ = Occupancy()
    problems: list[str] = []
    for lease, pieces in leases:
        problems += occ.add(lease, pieces)
    return problems


def pieces_from_api(lease: dict[str, Any]) -> list[Piece]:
    return [
        piece(s["gpu"], s["kind"], s.get("milli"), s.get("profile"), s.get("start"), lease["model"])
        for s in lease.get("slots") or ()
    ]


def parse_ts(value: str | None) -> float | None:
    if value is None:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


# -- database access (plain engines: no BEGIN IMMEDIATE, never in the service's way) -------------


def plain_engine(url: str) -> Engine:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        return create_engine(url, connect_args={"timeout": 30})
    return create_engine(url, pool_size=1)


LIVE_SLOTS_SQL = text(
    """
    SELECT s.lease_id, s.gpu_uuid, s.kind, s.milli, s.profile, s.start, l.state, g.model
    FROM lease_slots s JOIN leases l ON l.id = s.lease_id LEFT JOIN gpus g ON g.uuid = s.gpu_uuid
    WHERE s.live
    """
)
DUPLICATE_KEYS_SQL = text(
    """
    SELECT slot_key, count(*) FROM lease_slots WHERE live AND kind != 'shared'
    GROUP BY slot_key HAVING count(*) > 1
    """
)
OVERSHARED_SQL = text(
    """
    SELECT gpu_uuid, sum(milli) FROM lease_slots WHERE live AND kind = 'shared'
    GROUP BY gpu_uuid HAVING sum(milli) > 1000
    """
)
MIG_INSTANCES_SQL = text(
    "SELECT g.uuid, g.model, i.profile, i.start FROM mig_instances i JOIN gpus g ON g.id = i.gpu_id"
)


def db_violations(db: Engine) -> list[str]:
    """Double grants visible in the database right now (each query is one snapshot)."""
    problems: list[str] = []
    with db.connect() as conn:
        rows = conn.execute(LIVE_SLOTS_SQL).all()
        by_lease: dict[str, list[Piece]] = defaultdict(list)
        for lease, gpu, kind, milli, profile, start, state, model in rows:
            if state not in LIVE:
                problems.append(f"lease {lease} is {state} but its slot on {gpu} is live")
            by_lease[lease].append(piece(gpu, kind, milli, profile, start, model or ""))
        problems += conflicts_in_snapshot(by_lease.items())
        for key, n in conn.execute(DUPLICATE_KEYS_SQL):
            problems.append(f"SQL: {n} live slots hold {key}")
        for gpu, total in conn.execute(OVERSHARED_SQL):
            problems.append(f"SQL: live shares of {gpu} total {total} milli")
        instances = [
            (f"mig-instance@{start}", [piece(gpu, "mig", 0, profile, start, model)])
            for gpu, model, profile, start in conn.execute(MIG_INSTANCES_SQL)
        ]
        problems += [f"MIG instances overlap: {p}" for p in conflicts_in_snapshot(instances)]
    return problems


# -- the clients ---------------------------------------------------------------------------------


class CutOff(Exception):
    """The connection failed before a whole response came back: the outcome is unknown."""

    def __init__(self, sent: float, error: BaseException) -> None:
        super().__init__(repr(error))
        self.sent = sent


class Api:
    """One keep-alive HTTP/1.1 connection to the pool API."""

    def __init__(self, base: str, token: str) -> None:
        u = urlsplit(base)
        self.host, self.port, self.prefix = u.hostname or "127.0.0.1", u.port, u.path.rstrip("/")
        self.headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}
        self.conn: http.client.HTTPConnection | None = None
        self.cuts = 0

    def once(
        self, method: str, path: str, body: object = None, *, timeout: float | None = None
    ) -> tuple[int, Any, float, float]:
        """(status, JSON body, time sent, time answered); raises CutOff on connection errors.

        With ``timeout`` the request goes on a connection of its own that gives up after that
        many seconds, like an impatient spawner: the service still handles it.
        """
        if timeout is not None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        else:
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            conn = self.conn
        data = None if body is None else json.dumps(body).encode()
        sent = time.time()
        try:
            conn.request(method, f"{self.prefix}/{path}", body=data, headers=self.headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            if conn is self.conn:
                self.conn = None
            self.cuts += 1
            raise CutOff(sent, e) from None
        finally:
            if conn is not self.conn:
                conn.close()
        answered = time.time()
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = raw.decode(errors="replace")[:500]
        return resp.status, payload, sent, answered

    def retry(
        self, method: str, path: str, body: object = None, *, deadline: float
    ) -> tuple[int, Any, float, float]:
        """Like ``once`` but retries cut connections (for idempotent requests); the time sent
        is that of the first attempt."""
        first: float | None = None
        while True:
            try:
                status, payload, sent, answered = self.once(method, path, body)
                return status, payload, sent if first is None else first, answered
            except CutOff as e:
                first = e.sent if first is None else first
                if time.time() > deadline:
                    raise TimeoutError(f"{method} {path}: no answer before the deadline") from e
                time.sleep(RETRY_SLEEP)


@dataclass
class ClientSpec:
    cid: int
    api: str
    token: str
    iterations: int
    seed: int


@dataclass
class Held:
    """A lease one client was given, and what it knows about it."""

    id: str
    user: str
    server: str
    offer: str
    state: str  # what the client last saw
    via: str  # "post" or "reconcile" (found after a cut POST)
    slots: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None
    hold_from: float | None = None  # from then until hold_until the lease certainly held slots
    hold_until: float | None = None
    seen_granted: bool = False
    promoted: bool = False
    ready: bool = False  # the lease said so (a dynamic-MIG slice never is: no node makes it)
    final: dict[str, Any] | None = None


def client_main(spec: ClientSpec, progress: Any, out: Any) -> None:
    """One client process: allocate, sometimes keep alive, release; report everything."""
    try:
        out.put(("client", spec.cid, run_client(spec, progress)))
    except BaseException:
        out.put(("client", spec.cid, {"error": traceback.format_exc()}))


def run_client(spec: ClientSpec, progress: Any) -> dict[str, Any]:
    rng = random.Random(spec.seed)
    api = Api(spec.api, spec.token)
    deadline = time.time() + CLIENT_DEADLINE
    leases: list[Held] = []
    holding: list[Held] = []  # FIFO of leases not released yet
    responses: list[tuple[str, str, int, str | None, str | None, int]] = []
    unexpected: list[str] = []
    counts: Counter[str] = Counter()

    def log(method: str, route: str, status: int, payload: Any, expect: int) -> None:
        lease = payload if isinstance(payload, dict) else {}
        responses.append(
            (
                method,
                route,
                status,
                lease.get("id"),
                lease.get("state"),
                len(lease.get("slots") or ()),
            )
        )
        if status != expect:
            unexpected.append(f"{method} {route} -> {status}: {str(payload)[:300]}")

    def saw(held: Held, lease: dict[str, Any], answered: float) -> None:
        """Note a lease state seen in a response answered at ``answered``."""
        held.state, held.ready = lease["state"], bool(lease.get("ready"))
        if lease["state"] in LIVE:
            held.slots, held.model = lease["slots"], lease["model"]
            if not held.seen_granted:
                held.seen_granted = True
                held.hold_from = answered

    def reconcile(user: str, server: str) -> dict[str, Any] | None:
        """After a cut POST: did it commit? Look the server's lease up by user."""
        counts["reconciles"] += 1
        path = f"allocations?user={quote(user)}&limit=1000"
        status, page, _, _ = api.retry("GET", path, deadline=deadline)
        log("GET", "allocations?user", status, page, 200)
        if status != 200:
            return None
        found = [le for le in page["items"] if le["server"] == server]
        if len(found) > 1:
            unexpected.append(f"{len(found)} leases for {user}/{server}: a POST committed twice")
        return found[0] if found else None

    def allocate(i: int) -> None:
        user, server = f"u{spec.cid}-{i % USERS_PER_CLIENT}", f"s{i}"
        offer = rng.choice(OFFERS)
        body = {"user": user, "server": server, "offer": offer}
        unknown = False  # an earlier attempt may have committed
        while True:
            impatient = not unknown and rng.random() < IMPATIENT
            try:
                status, lease, _, answered = api.once(
                    "POST", "allocations", body, timeout=IMPATIENCE if impatient else None
                )
                via = "post"
            except CutOff as cut:
                counts["unknown_posts"] += 1
                counts["impatient_posts"] += impatient
                unknown = True
                if rng.random() < 0.5:  # back off: the attempt may be handled meanwhile
                    time.sleep(RETRY_SLEEP)
                lease = reconcile(user, server)
                if lease is None:  # it did not commit (or is not handled yet): ask again
                    if time.time() > deadline:
                        raise TimeoutError("POST allocations: no answer in time") from cut
                    time.sleep(RETRY_SLEEP)
                    continue
                counts["posts_found_by_reconcile"] += 1
                status, answered, via = 201, time.time(), "reconcile"
            code = lease.get("error", {}).get("code") if isinstance(lease, dict) else None
            if via == "post" and unknown and status == 409 and code == "already_allocated":
                # the attempt we gave up on was handled after all: (user, server) has its lease
                log("POST", "allocations", status, lease, 409)
                counts["posts_found_after_409"] += 1
                lease = reconcile(user, server)
                if lease is None:
                    unexpected.append(f"409 for {user}/{server} but no lease: {lease}")
                    return
                status, answered, via = 201, time.time(), "reconcile"
            break
        if via == "post":
            log("POST", "allocations", status, lease, 201)
        if status != 201:
            return
        held = Held(lease["id"], user, server, offer, lease["state"], via)
        saw(held, lease, answered)
        leases.append(held)
        holding.append(held)
        counts[f"first_{lease['state']}"] += 1
        if held.state == "granted" and rng.random() < 0.3:
            keepalive(held)

    def keepalive(held: Held) -> None:
        """Bind the lease as a server would; a grant that is not ready (its MIG instance does
        not exist: nothing makes instances in this test) must be refused with not_ready."""
        status, lease, _, answered = api.retry(
            "POST", f"allocations/{held.id}/keepalive", {}, deadline=deadline
        )
        if held.ready:
            log("POST", "keepalive", status, lease, 200)
        else:
            code = (lease.get("error") or {}).get("code") if isinstance(lease, dict) else None
            if (status, code) != (409, "not_ready"):
                unexpected.append(f"POST keepalive (not ready) -> {status}: {str(lease)[:300]}")
            log("POST", "keepalive", status, lease, status)  # checked just above
            counts["keepalives_not_ready"] += 1
        if status == 200:
            saw(held, lease, answered)
            counts["keepalives"] += 1

    def release(held: Held) -> None:
        if held.state == "queued" and rng.random() < 0.5:  # has it been promoted meanwhile?
            status, lease, _, answered = api.retry(
                "GET", f"allocations/{held.id}", deadline=deadline
            )
            log("GET", "allocation", status, lease, 200)
            if status == 200:
                saw(held, lease, answered)
                if lease["state"] in LIVE:
                    held.promoted = True
                    if rng.random() < 0.3:
                        keepalive(held)
        status, lease, sent, _ = api.retry("DELETE", f"allocations/{held.id}", deadline=deadline)
        log("DELETE", "allocation", status, lease, 200)
        held.final = lease if status == 200 else {"status": status, "body": lease}
        if status == 200 and not held.seen_granted and lease.get("granted"):
            # promoted after we last looked: it held its slots from the promotion, whose time
            # the service takes inside the releasing transaction (after the pool lock)
            held.promoted = held.seen_granted = True
            held.slots, held.model = lease["slots"], lease["model"]
            held.hold_from = parse_ts(lease["granted"])
        if held.seen_granted:
            held.hold_until = sent

    for i in range(spec.iterations):
        allocate(i)
        with progress.get_lock():
            progress.value += 1
        target = rng.randint(0, 4)  # leases this client keeps for a while
        while len(holding) > target:
            release(holding.pop(0))
    while holding:
        release(holding.pop(0))
    counts["cuts"] = api.cuts
    return {
        "leases": [vars(h) for h in leases],
        "responses": responses,
        "unexpected": unexpected,
        "counts": dict(counts),
    }


def checker_main(api_url: str, token: str, db_url: str, stop: Any, out: Any) -> None:
    """Sample the live leases (API, admin token) and slots (SQL) until told to stop."""
    try:
        api = Api(api_url, token)
        db = plain_engine(db_url)
        samples: Counter[str] = Counter()
        problems: list[str] = []
        while not stop.is_set():
            for state in ("granted", "active"):
                try:
                    status, page, _, _ = api.once("GET", f"allocations?state={state}&limit=1000")
                except CutOff:
                    samples["api_cut"] += 1
                    time.sleep(0.2)
                    continue
                if status != 200:
                    problems.append(f"GET allocations?state={state} -> {status}: {page}")
                    continue
                samples["api"] += 1
                samples["api_leases"] += len(page["items"])
                found = conflicts_in_snapshot(
                    (le["id"], pieces_from_api(le)) for le in page["items"]
                )
                problems += [f"API {state} snapshot: {p}" for p in found]
            try:
                problems += db_violations(db)
                samples["sql"] += 1
            except Exception as e:  # SQLite busy with a checkpoint, say: not a finding
                samples["sql_error"] += 1
                samples[f"sql_error:{type(e).__name__}"] += 1
            time.sleep(CHECK_EVERY)
        out.put(("checker", 0, {"samples": dict(samples), "problems": problems[:50]}))
    except BaseException:
        out.put(("checker", 0, {"error": traceback.format_exc()}))


# -- running the load ------------------------------------------------------------------------------


@dataclass
class Load:
    clients: dict[int, dict[str, Any]]
    checker: dict[str, Any]
    seconds: float
    kills: int = 0

    @property
    def leases(self) -> list[dict[str, Any]]:
        return [le for c in self.clients.values() for le in c["leases"]]

    def count(self, key: str) -> int:
        return sum(c["counts"].get(key, 0) for c in self.clients.values())


def start_env(tmp_path: Path, db_url: str) -> HubEnv:
    pool = write_pool(tmp_path, POOL_YAML, "contended-pool.yaml")
    env = HubEnv(
        tmp_path,
        db_url,
        pool,
        service_args=(
            "--PoolService.reconcile_on_start=False",
            "--PoolService.reconcile_interval=0",
            "--PoolService.housekeeping_interval=1",  # promote() runs between requests too
        ),
    )
    try:
        env.start()
    except Exception:
        print(env.logs())
        env.stop()
        raise
    return env


def run_load(env: HubEnv, db_url: str, *, kill_after: int | None = None) -> Load:
    """Run CLIENTS clients (and the checker) to the end; kill -9 the service once after
    ``kill_after`` allocations when asked, and start it again on the same database."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    progress = ctx.Value("i", 0)
    stop = ctx.Event()
    admin = env.token("admin")
    checker = ctx.Process(target=checker_main, args=(env.api, admin, db_url, stop, out))
    clients = [
        ctx.Process(
            target=client_main,
            args=(ClientSpec(c, env.api, env.spawner_token, ITERATIONS, 1000 + c), progress, out),
        )
        for c in range(CLIENTS)
    ]
    procs = [checker, *clients]
    started = time.monotonic()
    for p in procs:
        p.start()
    kills = 0
    results: dict[int, dict[str, Any]] = {}
    checked: dict[str, Any] | None = None
    try:
        if kill_after is not None:
            while progress.value < kill_after:
                if not any(p.is_alive() for p in clients):
                    break
                time.sleep(0.02)
            env.kill_service(signal.SIGKILL)
            kills += 1
            env.start_service()
        while len(results) < CLIENTS:
            try:
                kind, cid, payload = out.get(timeout=5)
            except queue.Empty:  # nothing for 5 s: what a finished client sent is in by now
                dead = [c for c, p in enumerate(clients) if not p.is_alive() and c not in results]
                if dead:
                    raise RuntimeError(f"clients {dead} died without a report") from None
                if time.monotonic() - started > CLIENT_DEADLINE + 30:
                    hung = set(range(CLIENTS)) - set(results)
                    raise TimeoutError(f"clients {hung} hang") from None
                continue
            if kind == "client":
                results[cid] = payload
            else:
                checked = payload
        seconds = time.monotonic() - started
        stop.set()
        while checked is None:
            kind, _, payload = out.get(timeout=60)
            if kind == "checker":
                checked = payload
    finally:
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
    errors = [r["error"] for r in [*results.values(), checked] if "error" in r]
    assert not errors, "\n".join(errors)
    return Load(results, checked, seconds, kills)


# -- the invariants --------------------------------------------------------------------------------


def client_interval_conflicts(leases: list[dict[str, Any]]) -> list[str]:
    """Double grants among the intervals in which the clients held leases for certain.

    A lease certainly holds its slots from the moment its client *received* a response showing
    it granted (or, for a promotion it only learned of on release, from the promotion time the
    service recorded inside the transaction) until the moment its client *sent* the DELETE. The
    commits lie outside that interval, so two overlapping intervals on one slice are a genuine
    double grant, whatever the scheduling of the clients.
    """
    events = []
    for le in leases:
        start, end = le["hold_from"], le["hold_until"]
        if start is None or end is None or start >= end:
            continue
        lease = {"model": le["model"], "slots": le["slots"]}
        events.append((start, 1, le["id"], pieces_from_api(lease)))
        events.append((end, 0, le["id"], []))
    events.sort(key=lambda e: (e[0], e[1]))
    occ = Occupancy()
    problems: list[str] = []
    for _, opening, lease_id, pieces in events:
        if opening:
            problems += occ.add(lease_id, pieces)
        else:
            occ.remove(lease_id)
    return problems


def audit_replay_conflicts(db: Engine) -> tuple[list[str], int]:
    """Replay the audit log in commit order: grants add slots, releases remove them."""
    with db.connect() as conn:
        model = dict(conn.execute(text("SELECT id, model FROM leases")).all())
        slots: dict[str, list[Piece]] = defaultdict(list)
        for lease, gpu, kind, milli, profile, start in conn.execute(
            text("SELECT lease_id, gpu_uuid, kind, milli, profile, start FROM lease_slots")
        ):
            slots[lease].append(piece(gpu, kind, milli, profile, start, model.get(lease) or ""))
        events = conn.execute(
            text(
                "SELECT kind, lease_id FROM events WHERE kind IN ('granted', 'released') "
                "ORDER BY id"
            )
        ).all()
    occ = Occupancy()
    problems: list[str] = []
    holding: set[str] = set()
    for kind, lease in events:
        if kind == "granted":
            if lease in holding:
                problems.append(f"audit: {lease} granted twice without a release")
            holding.add(lease)
            problems += occ.add(lease, slots[lease])
        else:
            holding.discard(lease)
            occ.remove(lease)
    return problems, len(events)


def check_invariants(load: Load, db_url: str) -> dict[str, Any]:
    """Assert (a) no double grant, (b) no lost lease, (c) a complete audit log."""
    db = plain_engine(db_url)
    try:
        unexpected = [u for c in load.clients.values() for u in c["unexpected"]]
        assert not unexpected, f"{len(unexpected)} unexpected responses: {unexpected[:10]}"
        # binds happened, and binds of MIG grants no node made were refused (not_ready)
        assert load.count("keepalives") > 0 and load.count("keepalives_not_ready") > 0
        leases = load.leases
        ids = [le["id"] for le in leases]
        assert len(ids) == len(set(ids)), "one lease id was given to two requests"
        assert len(ids) == CLIENTS * ITERATIONS, (len(ids), "every request got a lease")

        # (a) no double grant
        assert "problems" in load.checker, load.checker
        assert not load.checker["problems"], load.checker["problems"]
        assert load.checker["samples"].get("sql", 0) > 0, load.checker
        assert load.checker["samples"].get("api", 0) > 0, load.checker
        intervals = client_interval_conflicts(leases)
        assert not intervals, intervals[:10]
        replayed, n_events = audit_replay_conflicts(db)
        assert not replayed, replayed[:10]
        final = db_violations(db)
        assert not final, final

        with db.connect() as conn:
            rows = {
                r.id: r
                for r in conn.execute(
                    text("SELECT id, state, granted, release_reason, offer FROM leases")
                )
            }
            events = Counter(
                (kind, lease)
                for kind, lease in conn.execute(
                    text("SELECT kind, lease_id FROM events WHERE lease_id IS NOT NULL")
                )
            )
            live_slots = conn.scalar(text("SELECT count(*) FROM lease_slots WHERE live"))
        # (b) no lost lease
        missing = [i for i in ids if i not in rows]
        assert not missing, f"leases the clients were given are not in the database: {missing}"
        unknown = sorted(set(rows) - set(ids))
        assert not unknown, f"leases in the database no client knows of: {unknown[:10]}"
        left = {i: r.state for i, r in rows.items() if r.state != "released"}
        assert not left, f"leases left {set(left.values())} after every release: {left}"
        assert live_slots == 0, f"{live_slots} slots still live after every release"
        lost_grants = [
            le["id"] for le in leases if le["seen_granted"] and rows[le["id"]].granted is None
        ]
        assert not lost_grants, f"grants clients saw but the database lacks: {lost_grants}"
        not_released = [le["id"] for le in leases if (le["final"] or {}).get("state") != "released"]
        assert not not_released, f"DELETE did not answer a released lease: {not_released[:10]}"

        # (c) the audit log
        granted = {i for i, r in rows.items() if r.granted is not None}
        bad_granted = [i for i in rows if events[("granted", i)] != (1 if i in granted else 0)]
        assert not bad_granted, f"leases without exactly one granted event: {bad_granted[:10]}"
        bad_released = [i for i in rows if events[("released", i)] != 1]
        assert not bad_released, f"leases without exactly one released event: {bad_released[:10]}"
        queued_events = [i for i in rows if events[("queued", i)] > 1]
        assert not queued_events, queued_events[:10]
    finally:
        db.dispose()
    return {
        "leases": len(ids),
        "granted": len(granted),
        "first_queued": load.count("first_queued"),
        "promoted": sum(1 for le in leases if le["promoted"]),
        "keepalives": load.count("keepalives"),
        "keepalives_not_ready": load.count("keepalives_not_ready"),
        "responses": sum(len(c["responses"]) for c in load.clients.values()),
        "audit_events_replayed": n_events,
        "checker": load.checker["samples"],
        "seconds": round(load.seconds, 1),
        "cuts": load.count("cuts"),
        "unknown_posts": load.count("unknown_posts"),
        "posts_found_by_reconcile": load.count("posts_found_by_reconcile"),
        "posts_found_after_409": load.count("posts_found_after_409"),
        "impatient_posts": load.count("impatient_posts"),
    }


def _run(tmp_path: Path, db_url: str, kill_after: int | None) -> dict[str, Any]:
    env = start_env(tmp_path, db_url)
    try:
        load = run_load(env, db_url, kill_after=kill_after)
    except BaseException:
        print(env.logs())
        raise
    finally:
        env.stop()
    summary = check_invariants(load, db_url)
    summary["kills"] = load.kills
    print(json.dumps(summary, indent=1, sort_keys=True))
    return summary


# -- the tests -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_concurrent_allocate_release(tmp_path: Path, db_url: str) -> None:
    """8 clients × 250 allocate/release on a contended pool: no double grant, nothing lost."""
    summary = _run(tmp_path, db_url, kill_after=None)
    assert summary["first_queued"] > 0, "the pool was never contended: nothing queued"
    assert summary["promoted"] > 0, "no queued request was ever promoted"


@pytest.mark.slow
def test_kill_9_during_load(tmp_path: Path, db_url: str) -> None:
    """SIGKILL the service a third of the way through and restart it: no grant lost."""
    summary = _run(tmp_path, db_url, kill_after=CLIENTS * ITERATIONS // 3)
    assert summary["kills"] == 1
    # every impatient POST cuts one connection; the others were cut by the kill
    assert summary["cuts"] > summary["impatient_posts"], "the kill did not hit the load"


def test_occupancy_detects_double_grants() -> None:
    """The checker itself: it must flag every kind of overlap and accept legal packings."""
    whole = Piece("g1", "gpu")
    mig_a = Piece("g2", "mig", 0, "3g.40gb", 0, 4)
    mig_b = Piece("g2", "mig", 0, "1g.10gb", 3, 1)
    mig_c = Piece("g2", "mig", 0, "1g.10gb", 4, 1)
    half, quarter = Piece("g3", "shared", 500), Piece("g3", "shared", 250)
    assert conflicts_in_snapshot([("a", [whole]), ("b", [whole])])
    assert conflicts_in_snapshot([("a", [mig_a]), ("b", [mig_b])])
    assert not conflicts_in_snapshot([("a", [mig_a]), ("b", [mig_c])])
    assert not conflicts_in_snapshot([("a", [half]), ("b", [quarter]), ("c", [quarter])])
    assert conflicts_in_snapshot([("a", [half]), ("b", [half]), ("c", [quarter])])
    assert conflicts_in_snapshot([("a", [Piece("g2", "gpu")]), ("b", [mig_c])])
    lease = {"model": "A100-80GB", "slots": [{"gpu": "g", "kind": "mig", "profile": "3g.40gb"}]}
    assert pieces_from_api(lease)[0].size == 4
    # intervals: overlapping holds clash, back-to-back holds do not
    a = {"id": "a", "hold_from": 1.0, "hold_until": 3.0, "model": "H100-80GB"}
    a["slots"] = [{"gpu": "g1", "kind": "gpu", "milli": 1000}]
    b = {**a, "id": "b", "hold_from": 2.0, "hold_until": 4.0}
    c = {**a, "id": "c", "hold_from": 3.0, "hold_until": 5.0}
    assert client_interval_conflicts([a, b])
    assert not client_interval_conflicts([a, c])


def test_database_checks_detect_double_grants(tmp_path: Path) -> None:
    """The SQL checks and the audit replay flag overlapping live slots that the unique index
    lets through (different MIG starts, shares over a whole GPU), and live slots of ended leases."""
    import yaml

    from jupyterhub_gpupool.dbutil import make_engine, upgrade
    from jupyterhub_gpupool.pool.catalog import default_catalog
    from jupyterhub_gpupool.poolconfig import parse_pool_config
    from jupyterhub_gpupool.store import Store

    url = f"sqlite:///{tmp_path}/pool.sqlite"
    upgrade(url)
    catalog = default_catalog()
    store = Store(make_engine(url), catalog)
    store.load_config(parse_pool_config(yaml.safe_load(POOL_YAML), catalog))
    a = store.allocate("alice", "s1", "a100-3g")
    b = store.allocate("bob", "s1", "t4-half")
    assert a.state == b.state == "granted"
    db = plain_engine(url)
    assert db_violations(db) == []
    assert audit_replay_conflicts(db)[0] == []
    a100 = a.slots[0].gpu
    t4 = b.slots[0].gpu
    with db.begin() as conn:
        for lease, state in (("x1", "granted"), ("x2", "granted"), ("x3", "released")):
            conn.execute(
                text(
                    "INSERT INTO leases (id, user, server, offer, groups, priority, state, units,"
                    " units_f, borrowed, within_guarantee, model, created, granted, busy_hours)"
                    " VALUES (:id, 'eve', :id, 'x', '[]', 0, :state, '1', 1, 0, 1, :model,"
                    " '2026-01-01', '2026-01-01', 0)"
                ),
                {"id": lease, "state": state, "model": "A100-80GB"},
            )
        slot = text(
            "INSERT INTO lease_slots (lease_id, slot_key, gpu_uuid, kind, profile, start, milli,"
            ' "create", live) VALUES (:lease, :key, :gpu, :kind, :profile, :start, :milli, 0, 1)'
        )
        # a 1g.10gb inside alice's 3g.40gb (4 slices): a different slot_key, same slices
        inside = a.slots[0].start + 2
        conn.execute(
            slot,
            {
                "lease": "x1",
                "key": f"{a100}/mig/{inside}",
                "gpu": a100,
                "kind": "mig",
                "profile": "1g.10gb",
                "start": inside,
                "milli": 0,
            },
        )
        # a whole GPU taken over bob's share of the T4
        conn.execute(
            slot,
            {
                "lease": "x2",
                "key": t4,
                "gpu": t4,
                "kind": "gpu",
                "profile": None,
                "start": None,
                "milli": 1000,
            },
        )
        conn.execute(
            slot,
            {
                "lease": "x3",
                "key": f"{t4}/shared",
                "gpu": t4,
                "kind": "shared",
                "profile": None,
                "start": None,
                "milli": 750,
            },
        )
        conn.execute(
            text(
                "INSERT INTO events (ts, actor, kind, lease_id, data) VALUES"
                " ('2026-01-02', 'test', 'granted', 'x1', '{}')"
            )
        )
    found = db_violations(db)
    assert any("x3 is released" in p for p in found), found
    assert any("x1" in p and a.id in p for p in found), found
    assert any("x2" in p and b.id in p for p in found), found
    assert any("total 1250 milli" in p for p in found), found
    replayed, _ = audit_replay_conflicts(db)
    assert any("x1" in p for p in replayed), replayed
    db.dispose()
