"""The raw limit for ``service_load.py``: the rows a grant + release writes, by minimal SQL.

What the pool store writes for one allocate + release pair on PostgreSQL (see
``store/core.py``, ``store/apply.py``): per transaction the pool's version row is bumped
(``UPDATE pool_state ... RETURNING version``: the row lock that serialises every writer, across
replicas too); a grant inserts its lease row (the columns a grant sets), one ``lease_slots`` row
(live, under the unique partial index) and a ``granted`` audit event with its JSON data; a
release updates the lease (state, released, release_reason), marks its slot not live and
inserts a ``released`` event. Every transaction commits before it is "answered".

Two peers write exactly those rows, on a fresh database made by the same migrations (so the
same indexes), with psycopg directly (no ORM, no HTTP, no allocator, no JSON answers):

* ``batched`` (the honest peer of the service, and the one the service is compared with): the
  same group-commit shape as the store process: ``clients`` logical clients, each alternating
  grant and release; every transaction carries one operation of each client (half grants,
  half releases once staggered), one version bump, multi-row statements, one commit. This is
  what the service's design could reach if the store cost nothing but the database's work.
* ``per-request``: ``clients`` threads on their own connections, one transaction per
  operation (what a service without group commit would pay: the version row's lock is held
  for each transaction's round trips and its commit).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

LEASE_COLUMNS = (
    'id, "user", server, offer, "group", groups, clusters, hub, priority, state, units, '
    "units_f, borrowed, within_guarantee, node, model, created, granted, expires, busy_hours, "
    "exception, reclaim_pressure"
)
GRANT_LEASE = f"INSERT INTO leases ({LEASE_COLUMNS}) VALUES ({', '.join(['%s'] * 22)})"
GRANT_SLOT = (
    'INSERT INTO lease_slots (lease_id, slot_key, gpu_uuid, kind, profile, start, milli, "create", '
    "live) VALUES (%s, %s, %s, 'gpu', NULL, NULL, 1000, false, true)"
)
EVENT = (
    'INSERT INTO events (ts, actor, kind, lease_id, "user", data) VALUES (%s, %s, %s, %s, %s, %s)'
)
BUMP = "UPDATE pool_state SET version = version + 1 WHERE id = 1 RETURNING version"
RELEASE_LEASE = (
    "UPDATE leases SET state = 'released', released = %s, release_reason = 'stopped' "
    "WHERE id = ANY(%s)"
)
RELEASE_SLOTS = "UPDATE lease_slots SET live = false WHERE lease_id = ANY(%s)"


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _pg(url: str) -> str:
    return "postgresql://" + url.split("://", 1)[1]


def _grant_rows(client: int, n: int, now: datetime) -> tuple[tuple, tuple, tuple]:
    """The lease, slot and event rows of one grant (the values the store writes)."""
    lease_id = uuid.uuid4().hex
    user, gpu = f"bench{client}", f"GPU-raw-{client:04d}"
    lease = (
        lease_id, user, f"s{n}", "h100", user, "[]", None, None, 0, "granted", "1", 1.0,
        False, True, f"bench-{client % 64:03d}", "H100-80GB", now, now,
        now + timedelta(seconds=600), 0.0, False, False,
    )  # fmt: skip
    data = {"node": lease[14], "offer": "h100", "waited": None, "slots": [gpu]}
    event = (now, "system", "granted", lease_id, user, json.dumps(data))
    return lease, (lease_id, gpu, gpu), event


def _release_event(lease_id: str, user: str, now: datetime) -> tuple:
    data = {"reason": "stopped", "from": "granted"}
    return (now, "bench", "released", lease_id, user, json.dumps(data))


def _batched(url: str, clients: int, seconds: float, warmup: float) -> dict[str, Any]:
    """One connection; each transaction: one operation per logical client."""
    import psycopg

    held: dict[int, tuple[str, str] | None] = {c: None for c in range(clients)}
    pairs = txns = 0
    n = 0
    with psycopg.connect(_pg(url)) as conn:
        # staggered: the odd clients start holding a grant, so each transaction is half and half
        t_end = t_start = None
        first = True
        t0 = time.perf_counter()
        while True:
            now_pc = time.perf_counter()
            if t_start is None and now_pc - t0 >= warmup:
                t_start, pairs, txns = now_pc, 0, 0
            if t_start is not None and now_pc - t_start >= seconds:
                t_end = now_pc
                break
            now = _now()
            grants, releases = [], []
            for c in range(clients):
                if first and c % 2 == 0:
                    continue
                if held[c] is None:
                    n += 1
                    grants.append((c, _grant_rows(c, n, now)))
                else:
                    releases.append((c, held[c]))
            first = False
            with conn.cursor() as cur:
                cur.execute(BUMP)
                cur.fetchone()
                if releases:
                    ids = [lid for _, (lid, _u) in releases]
                    cur.execute(RELEASE_LEASE, (now, ids))
                    cur.execute(RELEASE_SLOTS, (ids,))
                    cur.executemany(
                        EVENT, [_release_event(lid, u, now) for _, (lid, u) in releases]
                    )
                if grants:
                    cur.executemany(GRANT_LEASE, [g[0] for _, g in grants])
                    cur.executemany(GRANT_SLOT, [g[1] for _, g in grants])
                    cur.executemany(EVENT, [g[2] for _, g in grants])
            conn.commit()
            txns += 1
            for c, _ in releases:
                held[c] = None
                pairs += 1
            for c, g in grants:
                held[c] = (g[0][0], g[0][1])
    span = t_end - t_start
    return {
        "mode": "batched",
        "grants_per_s": round(pairs / span, 1),
        "transactions_per_s": round(txns / span, 1),
        "ops_per_transaction": round(2 * pairs / txns, 1) if txns else None,
        "seconds": round(span, 2),
    }


def _per_request(url: str, clients: int, seconds: float, warmup: float) -> dict[str, Any]:
    """``clients`` threads, their own connections, one transaction per grant and release."""
    import psycopg

    start_at = time.perf_counter() + 0.5
    window = (start_at + warmup, start_at + warmup + seconds)
    counts = [0] * clients
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []

    def worker(c: int) -> None:
        try:
            with psycopg.connect(_pg(url)) as conn:
                n = 0
                while time.perf_counter() < start_at:
                    time.sleep(0.001)
                while (t0 := time.perf_counter()) < window[1]:
                    n += 1
                    now = _now()
                    lease, slot, event = _grant_rows(c, n, now)
                    with conn.cursor() as cur:
                        cur.execute(BUMP)
                        cur.execute(GRANT_LEASE, lease)
                        cur.execute(GRANT_SLOT, slot)
                        cur.execute(EVENT, event)
                    conn.commit()
                    with conn.cursor() as cur:
                        cur.execute(BUMP)
                        cur.execute(RELEASE_LEASE, (now, [lease[0]]))
                        cur.execute(RELEASE_SLOTS, ([lease[0]],))
                        cur.execute(EVENT, _release_event(lease[0], lease[1], now))
                    conn.commit()
                    if t0 >= window[0]:
                        counts[c] += 1
                        lat[c].append(1000 * (time.perf_counter() - t0))
        except Exception as e:  # reported, not hidden
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pair_ms = sorted(x for xs in lat for x in xs)
    p99 = pair_ms[min(len(pair_ms) - 1, int(0.99 * len(pair_ms)))] if pair_ms else None
    return {
        "mode": "per-request",
        "grants_per_s": round(sum(counts) / seconds, 1),
        "pair_p99_ms": None if p99 is None else round(p99, 2),
        "errors": errors[:3],
        "seconds": seconds,
    }


def raw_limit(
    create_db: Any, drop_db: Any, clients: int, seconds: float, warmup: float = 1.0
) -> dict[str, Any]:
    """Both peers, each on a fresh database made by the pool's migrations."""
    from jupyterhub_gpupool.dbutil import upgrade

    out: dict[str, Any] = {}
    for mode, fn in (("batched", _batched), ("per_request", _per_request)):
        url = create_db()
        try:
            upgrade(url)
            import psycopg

            with psycopg.connect(_pg(url), autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO pool_state (id, version) VALUES (1, 0) ON CONFLICT DO NOTHING"
                )
            out[mode] = fn(url, clients, seconds, warmup)
        finally:
            drop_db(url)
    return out
