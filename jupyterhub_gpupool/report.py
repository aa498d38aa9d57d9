"""``jupyterhub-gpupool report``: the monthly chargeback report as a CSV or HTML file.

For people who never open the admin panel: GPU unit-hours held, busy and idle and their cost
per group, user and offer for one calendar month (UTC), and the top idle holders. It reads the
pool database directly through the store, as ``upgrade-db`` does (the service may be running or
not), with the prices of the pool config file; the figures are the usage API's to the cent.
"""

from __future__ import annotations

import argparse
import csv
import html
import io
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from .pool.pricing import USAGE_COLUMNS

SECTIONS = ("group", "user", "offer")
#: The usage columns (the store, with SQLAlchemy, is imported only when a report is made).
COLUMNS = USAGE_COLUMNS
_MONTH = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")


class ReportError(Exception):
    """A bad argument or an unusable database: one line, exit status 2."""


def month_range(month: str) -> tuple[datetime, datetime]:
    """[first day, first day of the next month) of ``YYYY-MM`` (UTC, naive)."""
    m = _MONTH.match(month)
    if not m:
        raise ReportError(f"--month must be YYYY-MM (e.g. 2026-11), got {month!r}")
    year, mon = int(m.group(1)), int(m.group(2))
    start = datetime(year, mon, 1)
    end = datetime(year + (mon == 12), mon % 12 + 1, 1)
    return start, end


def open_store(db_url: str, pool_config: str | None) -> Any:
    """A store on an existing, migrated pool database, priced by ``pool_config``."""
    from .dbutil import current_revision, head_revision, make_engine
    from .pool.catalog import default_catalog
    from .pool.errors import PoolError
    from .poolconfig import PoolConfig, load_pool_config
    from .store import Store

    if db_url.startswith("sqlite:///") and ":memory:" not in db_url:
        path = Path(db_url.removeprefix("sqlite:///"))
        if not path.exists():
            raise ReportError(f"no pool database at {db_url} (no such file)")
    catalog = default_catalog()
    try:
        config = load_pool_config(pool_config, catalog) if pool_config else PoolConfig()
    except PoolError as e:
        raise ReportError(str(e)) from None
    try:
        engine = make_engine(db_url)
        revision = current_revision(engine)
    except Exception as e:  # a bad URL or an unreachable server: say which, in one line
        raise ReportError(f"cannot read the pool database at {db_url}: {e}".splitlines()[0]) from e
    if revision is None:
        raise ReportError(f"{db_url} is not a pool database (run jupyterhub-gpupool upgrade-db)")
    if revision != head_revision():
        raise ReportError(
            f"the pool database is at {revision}, this version reads {head_revision()}: "
            "run jupyterhub-gpupool upgrade-db"
        )
    return Store(engine, catalog, file_config=config)


#: Said in every report: a grant is billed from the moment it is made.
UNBOUND_NOTE = (
    "Unbound grants (granted, never started) are billed: a lease is held from its grant to "
    "its release, whether or not a server ever used it."
)
#: Said in every report: what "estimated" busy time is.
ESTIMATED_NOTE = (
    "Busy time marked estimated was judged from memory and processes in use (MIG slices of "
    "GPUs without utilization for slices), as the idle-reclaim rules judge it."
)


def build(store: Any, start: datetime, end: datetime, top: int = 10) -> dict[str, Any]:
    """Every figure of the report: the usage API's JSON for each grouping and of the idle
    holders (``service/serialize/usage.py``, so the file shows the API's figures as written)."""
    from .service.serialize.usage import idle_holders_json, usage_report_json

    sections = {by: usage_report_json(store.usage_report(start, end, by)) for by in SECTIONS}
    return {
        "from": start,
        "to": end,
        "currency": store.prices.currency,
        "prices": sections["group"]["prices"],
        "sections": sections,
        "idle": idle_holders_json(store.idle_holders(start, end, top)),
    }


def to_csv(report: dict[str, Any]) -> str:
    """One table: ``section,kind,name`` then the usage columns; each section ends with its
    ``total`` row, then the idle holders (section ``idle-holders``)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["section", "kind", "name", *COLUMNS, "currency"])
    cur = report["currency"]
    for by in SECTIONS:
        sec = report["sections"][by]
        for row in sec["items"]:
            kind = "no-group" if row["kind"] == "no-group" else "row"
            w.writerow([by, kind, row[by], *(row[c] for c in COLUMNS), cur])
        w.writerow([by, "total", "(total)", *(sec["total"][c] for c in COLUMNS), cur])
    for r in report["idle"]:
        idle = {c: r.get(c, "") for c in COLUMNS} | {"cost": r["idle_cost"]}
        w.writerow(["idle-holders", "row", r["user"], *(idle[c] for c in COLUMNS), cur])
    blank = [""] * len(COLUMNS)
    for p in report["prices"]:
        name = f"{p['model']} from {p['from'] or 'always'}: held {p['held']}, busy {p['busy']}"
        w.writerow(["prices", "price", name, *blank, cur])
    for note in (UNBOUND_NOTE, ESTIMATED_NOTE):
        w.writerow(["notes", "note", note, *blank, ""])
    return out.getvalue()


_CSS = (
    "body{font:14px system-ui,sans-serif;margin:2em;color:#222}"
    "table{border-collapse:collapse;margin:0 0 2em}th,td{padding:4px 10px;border-bottom:1px solid"
    " #ddd}td.n{text-align:right;font-variant-numeric:tabular-nums}tr.total td{font-weight:600;"
    "border-top:2px solid #444}caption{text-align:left;font-weight:600;padding:4px 0}"
)
_HEAD = {
    "leases": "leases",
    "held_unit_hours": "held (unit-h)",
    "busy_unit_hours": "busy (unit-h)",
    "estimated_busy_unit_hours": "of which estimated",
    "idle_unit_hours": "idle (unit-h)",
    "idle_share": "idle share",
    "unpriced_unit_hours": "unpriced (unit-h)",
    "cost": "cost",
}


def _cell(value: object, numeric: bool = True) -> str:
    if isinstance(value, float):
        value = f"{value:,.6f}".rstrip("0").rstrip(".")
    return f'<td class="{"n" if numeric else ""}">{html.escape(str(value))}</td>'


def to_html(report: dict[str, Any]) -> str:
    """A standalone page (no script, nothing fetched): every value escaped."""
    e = html.escape
    cur = e(report["currency"])
    month = report["from"].strftime("%B %Y")
    total = report["sections"]["group"]["total"]
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>GPU usage and cost, {e(month)}</title><style>{_CSS}</style></head><body>",
        f"<h1>GPU usage and cost, {e(month)}</h1>",
        f"<p>{e(report['from'].isoformat())}Z to {e(report['to'].isoformat())}Z (UTC). "
        f"Total: <strong>{e(total['cost'])} {cur}</strong> for "
        f"{total['held_unit_hours']:,} GPU unit-hours held, "
        f"{total['idle_share'] * 100:.1f}% of them idle. Each lease's cost is rounded once to "
        "the cent; every total is the sum of the rows above it.</p>",
        f"<p>{e(UNBOUND_NOTE)} {e(ESTIMATED_NOTE)}</p>",
    ]
    if not report["prices"]:
        parts.append("<p>No prices were in force for this month: every cost is 0.</p>")
    else:
        parts.append(f"<table><caption>Prices used ({cur} per unit-hour)</caption><thead><tr>")
        parts += [f"<th>{h}</th>" for h in ("model", "in force from", "held", "busy")]
        parts.append("</tr></thead><tbody>")
        for p in report["prices"]:
            parts.append(
                f"<tr>{_cell(p['model'], False)}{_cell(p['from'] or 'always', False)}"
                f"{_cell(p['held'])}{_cell(p['busy'])}</tr>"
            )
        parts.append("</tbody></table>")
    for by in SECTIONS:
        sec = report["sections"][by]
        parts.append(f"<table><caption>By {e(by)}</caption><thead><tr><th>{e(by)}</th>")
        parts += [f"<th>{e(_HEAD[c])}</th>" for c in COLUMNS]
        parts.append("</tr></thead><tbody>")
        for row in sec["items"]:
            cells = "".join(_cell(row[c]) for c in COLUMNS)
            kind = ' class="no-group"' if row["kind"] == "no-group" else ""
            parts.append(f"<tr{kind}>{_cell(row[by], False)}{cells}</tr>")
        cells = "".join(_cell(sec["total"][c]) for c in COLUMNS)
        parts.append(f'<tr class="total"><td>total</td>{cells}</tr></tbody></table>')
    parts.append("<table><caption>Top idle holders</caption><thead><tr><th>user</th>")
    parts += [f"<th>{h}</th>" for h in ("idle (unit-h)", "idle share", f"idle cost ({cur})")]
    parts.append("</tr></thead><tbody>")
    for r in report["idle"]:
        parts.append(
            f"<tr>{_cell(r['user'], False)}{_cell(r['idle_unit_hours'])}"
            f"{_cell(format(r['idle_share'], '.1%'))}{_cell(r['idle_cost'])}</tr>"
        )
    parts.append("</tbody></table></body></html>\n")
    return "".join(parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``report`` subcommand's flags."""
    parser.add_argument("--month", required=True, help="the calendar month, YYYY-MM (UTC)")
    parser.add_argument("--format", choices=("csv", "html"), default="csv", help="file format")
    parser.add_argument(
        "--db-url",
        default="sqlite:///jupyterhub-gpupool.sqlite",
        help="SQLAlchemy URL of the pool database (default: %(default)s)",
    )
    parser.add_argument(
        "--pool-config", default=None, help="the pool config file (YAML) with the prices"
    )
    parser.add_argument(
        "--top", type=int, default=10, help="how many idle holders to list (default: 10)"
    )
    parser.add_argument(
        "-o",
        "--output",
        default=None,
        help="where to write (default: gpu-report-MONTH.FORMAT here; '-' for stdout)",
    )


def run_cli(args: argparse.Namespace) -> int:
    """Write the report; a bad argument or database is one line on stderr, exit status 2."""
    try:
        start, end = month_range(args.month)
        if args.top < 1:
            raise ReportError("--top must be at least 1")
        store = open_store(args.db_url, args.pool_config)
        report = build(store, start, end, args.top)
    except ReportError as e:
        print(f"jupyterhub-gpupool report: error: {e}", file=sys.stderr)
        return 2
    text = to_csv(report) if args.format == "csv" else to_html(report)
    target = args.output or f"gpu-report-{args.month}.{args.format}"
    if target == "-":
        sys.stdout.write(text)
        return 0
    try:
        Path(target).write_text(text, encoding="utf-8")
    except OSError as e:
        print(
            f"jupyterhub-gpupool report: error: cannot write {target}: {e.strerror}",
            file=sys.stderr,
        )
        return 2
    print(f"wrote {target}", file=sys.stderr)
    return 0
