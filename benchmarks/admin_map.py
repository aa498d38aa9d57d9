"""The admin panel's pool map with 1,000 simulated GPUs (mixed MIG) in Chromium.

Targets (issue 14, item 10): the map renders in under 1 s, a refresh costs under 200 ms of
main-thread time, and the API calls behind a refresh cost the service under 50 ms.

The pool: 1,000 GPUs on 125 nodes of 8 — 40 nodes of dynamic-MIG A100s, 40 of A100s with a
static 7 × 1g.10gb layout, 30 of whole H100s and 15 of shared T4s — about 60 % of it held by
leases made through the store (so each slice has a holder, an offer and an idle count). A real
hub and the pool service run as in the integration tests (``tests/integration/hubenv.py``,
SQLite); Chromium (Playwright on /usr/bin/chromium) logs in through the hub as the admin.

1. **Render**: a fresh load of ``admin/``, from navigation start to the end of the first
   map render (the page's ``gpupool:map-rendered`` mark, which follows the API answer, its
   parse and the DOM built), and to the next frame painted after it.
2. **Refresh main thread**: with live refresh off, ``gpupoolMap.refresh()`` is called and the
   page's main-thread work for it is read from the Chrome DevTools Protocol
   (``Performance.getMetrics``: the delta of ``TaskDuration``, which covers script, style,
   layout and paint tasks) up to the next frame; both the unchanged case (cells updated in
   place) and a changed one (a lease released in between) are measured.
3. **Service**: ``GET pool/map`` (the one call behind a refresh) timed from a client on
   loopback with the admin's token, keep-alive — for an unchanged pool (the store's map is kept
   by pool version) and right after a change (a lease released: the map is rebuilt; ``--changes``
   of them) — and the service's own handler times for each from its request log.

Run ``python benchmarks/admin_map.py`` (``--rounds 20 --changes 60``); JSON goes to
``benchmarks/results/admin_map.json``. ``--compare-tree DIR`` (another checkout, e.g. the
previous commit through ``git worktree add /tmp/before HEAD~1``) measures the service's figures
of both in the same run, on the same hub and pool: the service is restarted from one tree and
the other in turn (``PYTHONPATH``), blocks of GETs alternating, so both see the same load.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from jupyterhub_gpupool.dbutil import make_engine, upgrade  # noqa: E402
from jupyterhub_gpupool.pool.catalog import default_catalog  # noqa: E402
from jupyterhub_gpupool.poolconfig import load_pool_config  # noqa: E402
from jupyterhub_gpupool.store import Store  # noqa: E402
from tests.integration.hubenv import HubEnv  # noqa: E402

DEFAULT_JSON = HERE / "results" / "admin_map.json"
CHROMIUM = "/usr/bin/chromium"
TARGETS = {"render_ms": 1000.0, "refresh_main_thread_ms": 200.0, "service_ms": 50.0}


def pool_yaml() -> str:
    """125 nodes × 8 GPUs: dynamic-MIG A100s, static-MIG A100s, whole H100s, shared T4s."""
    static = ", ".join(f"{{profile: 1g.10gb, start: {s}}}" for s in range(7))
    nodes = []
    for kind, count, gpu in (
        ("dyn", 40, "{model: A100-80GB, count: 8, mig: {enabled: true, dynamic: true}}"),
        (
            "mig",
            40,
            f"{{model: A100-80GB, count: 8, mig: {{enabled: true, instances: [{static}]}}}}",
        ),
        ("h100", 30, "{model: H100-80GB, count: 8}"),
        ("t4", 15, "{model: T4, count: 8, sharing: shared}"),
    ):
        for i in range(count):
            nodes.append(
                f"  - name: {kind}-{i:03d}\n    cpu_milli: 256000\n    memory_mib: 2097152\n"
                f"    gpus:\n      - {gpu}\n"
            )
    offers = """
offers:
  - {name: a100-1g, kind: mig, profile: 1g.10gb, models: [A100-80GB], display_name: "A100 1g"}
  - {name: a100-3g, kind: mig, profile: 3g.40gb, models: [A100-80GB], display_name: "A100 3g"}
  - {name: h100, kind: gpu, count: 1, models: [H100-80GB], display_name: "1x H100"}
  - {name: t4-quarter, kind: shared, fraction: 0.25, models: [T4], display_name: "T4 quarter"}
quotas:
  default: {guarantee: 4, limit: 100000}
"""
    return "nodes:\n" + "".join(nodes) + offers


def populate(db_url: str, pool: Path) -> int:
    """Leases through the store (the same rows the service serves): about 60 % held."""
    upgrade(db_url)
    catalog = default_catalog()
    store = Store(make_engine(db_url), catalog)
    store.load_config(load_pool_config(str(pool), catalog))
    asks = (
        [("a100-1g", i) for i in range(40 * 8 * 3)]  # dynamic A100s: 3 × 1g each
        + [("a100-3g", i) for i in range(40 * 8)]  # and a 3g each
        + [("a100-1g", 10_000 + i) for i in range(40 * 8 * 4)]  # static: 4 of 7 taken
        + [("h100", i) for i in range(30 * 8 * 6 // 10)]
        + [("t4-quarter", i) for i in range(15 * 8 * 2)]
    )
    made = 0
    for offer, i in asks:
        lease = store.allocate(f"user{i % 400:03d}", f"{offer}-{i}", offer)
        made += lease.state == "granted"
    return made


def timed_get(url: str, token: str, rounds: int) -> list[float]:
    """Milliseconds of each GET over one keep-alive connection."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        conn.request("GET", parts.path, headers={"Authorization": f"token {token}"})
        r = conn.getresponse()
        r.read()
        out.append((time.perf_counter() - t0) * 1000)
        assert r.status == 200, r.status
    conn.close()
    return out


def handler_times(log: Path, start: int = 0, end: int | None = None) -> list[float]:
    """The service's own times for ``GET pool/map`` (its request log, at --log-level=DEBUG),
    logged between byte offsets ``start`` and ``end`` of the log."""
    with log.open("rb") as f:
        f.seek(start)
        text = f.read(None if end is None else end - start).decode(errors="replace")
    out = []
    for line in text.splitlines():
        if "GET /services/gpupool/api/v1/pool/map" in line and line.rstrip().endswith("ms"):
            out.append(float(line.rsplit(" ", 1)[1][:-2]))
    return out


def main_thread_ms(cdp: Any, page: Any, action: str) -> float:
    """Main-thread task time (ms) of running ``action`` in the page, to the next frame."""
    before = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    frame = "new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)))"
    page.evaluate(f"async () => {{ await ({action}); await {frame}; }}")
    after = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    return (after["TaskDuration"] - before["TaskDuration"]) * 1000


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def spread(values: list[float]) -> dict[str, float | int | None]:
    """Median, p95 and max of ``values`` (None when there are none)."""
    if not values:
        return {"n": 0, "median": None, "p95": None, "max": None}
    return {
        "n": len(values),
        "median": statistics.median(values),
        "p95": pct(values, 0.95),
        "max": max(values),
    }


def use_tree(env: HubEnv, tree: Path) -> None:
    """Restart the pool service with its code from ``tree`` (same database, hub and tokens)."""
    env.kill_service(signal.SIGTERM)
    os.environ["PYTHONPATH"] = str(tree)
    env.start_service()


def service_block(
    env: HubEnv, token: str, leases: list[str], gets: int, into: dict[str, Any]
) -> None:
    """Time ``GET pool/map`` right after each of ``leases`` is released, then ``gets`` times
    unchanged; the client's and the handler's (its request log) times go ``into``."""
    api, log = f"{env.api}/pool/map", env.dir / "service.log"
    start = log.stat().st_size
    timed_get(api, token, 2)  # a fresh service: the token checked with the hub, the map built
    for lid in leases:
        _delete(f"{env.api}/allocations/{lid}?reason=admin", token)
        into["after_change"]["client"] += timed_get(api, token, 1)
    into["unchanged"]["client"] += timed_get(api, token, gets)
    # the request log is written after each answer: wait for every line, then split in order
    want = 2 + len(leases) + gets
    deadline = time.monotonic() + 30
    while len(handler := handler_times(log, start)) < want and time.monotonic() < deadline:
        time.sleep(0.1)
    into["after_change"]["handler"] += handler[2 : 2 + len(leases)]
    into["unchanged"]["handler"] += handler[2 + len(leases) : want]


def run(rounds: int, changes: int, compare_tree: Path | None = None) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        pool = where / "pool.yaml"
        pool.write_text(pool_yaml())
        db_url = f"sqlite:///{where}/pool.sqlite"
        t0 = time.perf_counter()
        leases = populate(db_url, pool)
        print(f"pool: 1000 GPUs, {leases} leases granted ({time.perf_counter() - t0:.0f} s)")
        env = HubEnv(
            where,
            db_url,
            pool,
            service_args=(
                "--PoolService.reconcile_on_start=False",
                "--PoolService.reconcile_interval=0",
                "--PoolService.check_user_servers=False",
                "--PoolService.log_level=DEBUG",
            ),
        )
        with env.running():
            token = env.token("admin")
            api = f"{env.api}/pool/map"
            timed_get(api, token, 2)  # warm up
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
                context = browser.new_context(viewport={"width": 1400, "height": 900})
                page = context.new_page()
                page.goto(f"{env.hub_url}/hub/login")
                page.fill("#username_input", "admin")
                page.fill("#password_input", "x")
                page.click("#login_submit")
                page.wait_for_url("**/hub/**")
                renders, painted = [], []
                for _ in range(max(3, rounds // 4)):
                    page.goto(f"{env.hub_url}/services/gpupool/admin/")
                    page.wait_for_function(
                        "() => performance.getEntriesByName('gpupool:map-rendered').length > 0",
                        timeout=60_000,
                    )
                    marks = page.evaluate(
                        """() => new Promise(r => requestAnimationFrame(() => r([
                            performance.getEntriesByName('gpupool:map-rendered')[0].startTime,
                            performance.now()])))"""
                    )
                    renders.append(marks[0])
                    painted.append(marks[1])
                cells = page.locator("#pool-map .slice").count()
                gpus = page.locator("#pool-map .gpu").count()
                page.uncheck("#map-filters input[name=live]")
                cdp = context.new_cdp_session(page)
                cdp.send("Performance.enable", {"timeDomain": "threadTicks"})
                same = [
                    main_thread_ms(cdp, page, "window.gpupoolMap.refresh()") for _ in range(rounds)
                ]
                script = [page.evaluate("window.gpupoolMap.lastRenderMs") for _ in range(1)]
                changed = []
                live = list(json.loads(_get(api, token))["leases"])[: rounds + changes]
                for lid in live[:rounds]:
                    _delete(f"{env.api}/allocations/{lid}?reason=admin", token)
                    changed.append(main_thread_ms(cdp, page, "window.gpupoolMap.refresh()"))
                browser.close()
            # the service after a change (the map rebuilt), and unchanged (kept); with a tree
            # to compare, in blocks alternating between the two trees' services
            trees = [ROOT] + ([compare_tree] if compare_tree else [])
            times = {
                t: {c: {"client": [], "handler": []} for c in ("after_change", "unchanged")}
                for t in trees
            }
            blocks = 3 if compare_tree else 1
            todo = live[rounds:]
            per = max(1, len(todo) // (blocks * len(trees)))
            for b in range(blocks):
                for i, tree in enumerate(trees):
                    if compare_tree:
                        use_tree(env, tree)
                    k = (b * len(trees) + i) * per
                    service_block(env, token, todo[k : k + per], per, times[tree])
    return {
        "gpus": gpus,
        "slices_drawn": cells,
        "leases": leases,
        "render_ms": {"median": statistics.median(renders), "max": max(renders)},
        "render_to_paint_ms": {"median": statistics.median(painted), "max": max(painted)},
        "refresh_main_thread_ms": {
            "unchanged_median": statistics.median(same),
            "unchanged_p95": pct(same, 0.95),
            "changed_median": statistics.median(changed),
            "changed_p95": pct(changed, 0.95),
            "render_script_ms": script[0],
        },
        "service_ms": _spreads(times[ROOT]),
        "compare": None
        if compare_tree is None
        else {"tree": str(compare_tree), "service_ms": _spreads(times[compare_tree])},
        "targets": TARGETS,
    }


def _get(url: str, token: str) -> str:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("GET", parts.path, headers={"Authorization": f"token {token}"})
    body = conn.getresponse().read().decode()
    conn.close()
    return body


def _delete(url: str, token: str) -> None:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request(
        "DELETE", f"{parts.path}?{parts.query}", headers={"Authorization": f"token {token}"}
    )
    r = conn.getresponse()
    r.read()
    conn.close()
    assert r.status == 200, r.status


def _spreads(times: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    return {case: {side: spread(v) for side, v in sides.items()} for case, sides in times.items()}


SERVICE_ROWS = (
    ("unchanged", "client", "GET pool/map, unchanged pool, client on loopback"),
    ("unchanged", "handler", "GET pool/map, unchanged pool, service handler"),
    ("after_change", "client", "GET pool/map right after a change, client"),
    ("after_change", "handler", "GET pool/map right after a change, service handler"),
)


def _fig(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_service(out: dict[str, Any], old: dict[str, Any] | None) -> None:
    """The service's figures (median / p95 / max, ms), beside ``old``'s where given (the
    ``--compare-tree``'s, measured in the same run)."""
    header = f"{'':52} {'median':>7} {'p95':>7} {'max':>7}"
    if old is not None:
        header += f" | {'before: median':>14} {'p95':>7} {'max':>7}"
    print(header)
    for case, side, label in SERVICE_ROWS:
        now = out["service_ms"][case][side]
        line = f"{label:52} " + " ".join(f"{_fig(now[k]):>7}" for k in ("median", "p95", "max"))
        if old is not None:
            was = old["service_ms"][case][side]
            line += f" | {_fig(was['median']):>14} {_fig(was['p95']):>7} {_fig(was['max']):>7}"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--changes", type=int, default=60, help="GETs timed right after a lease is released"
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument(
        "--compare-tree",
        type=Path,
        default=None,
        help="another checkout whose pool service is measured in the same run, alternately",
    )
    args = parser.parse_args()
    tree = args.compare_tree.resolve() if args.compare_tree else None
    if tree is not None and not (tree / "jupyterhub_gpupool").is_dir():
        parser.error(f"--compare-tree: {tree} has no jupyterhub_gpupool package")
    out = run(args.rounds, args.changes, tree)
    out["machine"] = {"python": platform.python_version(), "platform": platform.platform()}
    r, f = out["render_ms"], out["refresh_main_thread_ms"]
    print(f"map of {out['gpus']} GPUs, {out['slices_drawn']} slices drawn")
    print(
        f"render (navigation → map drawn): median {r['median']:.0f} ms, max {r['max']:.0f} ms"
        f" (target < {TARGETS['render_ms']:.0f} ms)"
    )
    print(f"  to the next frame painted: median {out['render_to_paint_ms']['median']:.0f} ms")
    print(
        f"refresh, main thread: unchanged median {f['unchanged_median']:.1f} ms"
        f" (p95 {f['unchanged_p95']:.1f}); after a change median {f['changed_median']:.1f} ms"
        f" (p95 {f['changed_p95']:.1f}) (target < {TARGETS['refresh_main_thread_ms']:.0f} ms)"
    )
    print(f"service, ms (target < {TARGETS['service_ms']:.0f} ms):")
    if tree is not None:
        print(f"  before: the pool service of {tree}, alternating with this tree's")
    print_service(out, out["compare"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
