"""``GPUPoolWidget()``: the lab panel's lease, quota, utilization and notice, live in a notebook.

Built from ipywidgets 8's own controls (HTML and a Button), so it needs no frontend of its own.
It reads the server extension's shared state (:func:`jupyterlab_gpupool.status`), refreshed
every ``interval`` seconds while the kernel runs; the server extension asks the pool for every
tab and widget together, so a widget adds no load on the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import time
from typing import Any

import ipywidgets as widgets

from jupyterhub_gpupool.timeparse import parse_time

from .client import call, status


def _units(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.2g}" if x < 1 else f"{x:.3g}"


def _mib(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x / 1024:.1f} GiB" if x >= 1024 else f"{x:.0f} MiB"


def _countdown(deadline: str, now: float) -> str:
    try:
        moment = parse_time(deadline)
    except ValueError:
        return "?"
    if moment is None:
        return "?"
    end = moment.timestamp()
    left = max(0, int(end - now))
    h, rest = divmod(left, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _clock(iso: str) -> str:
    """``2026-12-01T14:04:32Z`` → ``14:04 UTC``."""
    when = parse_time(iso, lenient=True)
    return when.strftime("%H:%M UTC") if when is not None else iso


def _action_text(action: str) -> str:
    """What the notice's action means for the user (the panel's words)."""
    if action == "release-gpu":
        return "your server will restart without a GPU (open documents are saved first)"
    if action.startswith("shrink:"):
        return f"your server will restart on {action[7:]} (open documents are saved first)"
    return "your server will be stopped (open documents are saved first)"


def _when(iso: str | None) -> str:
    """``2026-12-01T14:04:32.70Z`` → ``2026-12-01 14:04 UTC``."""
    if not iso:
        return "?"
    try:
        moment = parse_time(iso)
    except ValueError:
        return iso
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else "?"


def _meter(label: str, value: float, total: float | None, text: str) -> str:
    hi = total if total else max(value, 1.0)
    return (
        f"<div><b>{html.escape(label)}</b>: {html.escape(text)}<br>"
        f'<meter aria-label="{html.escape(label)}" min="0" max="{hi}" value="{value}" '
        f'style="width: 16em">{html.escape(text)}</meter></div>'
    )


def render(state: dict[str, Any], now: float | None = None) -> dict[str, str]:
    """The widget's parts as HTML (``lease``, ``activity``, ``quota``, ``notice``): a pure
    function of the state, so it is tested without a kernel."""
    now = time.time() if now is None else now
    e = html.escape
    pool = state.get("pool") or {}
    lease = state.get("lease")
    parts = {"lease": "", "activity": "", "quota": "", "notice": ""}
    head = ""
    if not pool.get("ok"):
        head = (
            f'<p role="status"><b>The GPU pool is not answering</b>: '
            f"{e(str(pool.get('error') or 'asking…'))}</p>"
        )
    if lease is None:
        parts["lease"] = head + "<p><b>CPU only</b>: this server has no GPU.</p>"
    else:
        mig = next((d for d in lease.get("devices") or [] if d.get("kind") == "mig"), None)
        where = f"MIG {e(mig['profile'] or '')} on {e(mig['parent'] or '')}" if mig else ""
        parts["lease"] = head + (
            f"<p><b>{e(lease['device'])}</b> — {e(lease.get('offer_name') or lease['offer'])}"
            f" on {e(lease.get('node') or '?')}{' · ' + where if where else ''}"
            f" · since {e(_when(lease.get('since')))}</p>"
        )
        util = state.get("utilization") or {}
        samples = (util.get("local") or []) if state.get("local", {}).get("available") else []
        samples = samples or util.get("pool") or []
        last = samples[-1] if samples else None
        total = lease.get("memory_total_mib")
        if last is None:
            parts["activity"] = "<p>No readings yet.</p>"
        else:
            u = last.get("util")
            bits = []
            if u is not None:
                bits.append(_meter("Utilization", u, 100, f"{u:.0f}%"))
            used = last.get("memory_used_mib") or 0
            bits.append(_meter("Memory", used, total, f"{_mib(used)} / {_mib(total)}"))
            parts["activity"] = "".join(bits)
    q = state.get("quota")
    if q:
        limit = q.get("limit")
        budget = q.get("budget")
        parts["quota"] = _meter(
            "GPU units in use",
            q["held_units"],
            limit,
            f"{_units(q['held_units'])} (guarantee {_units(q['guarantee'])}, limit "
            f"{'none' if limit is None else _units(limit)})",
        ) + _meter(
            f"Unit-hours this {q['period']}",
            q["used_unit_hours"],
            budget,
            f"{_units(q['used_unit_hours'])} used, no budget set"
            if budget is None
            else f"{_units(q['used_unit_hours'])} of {_units(budget)}, resets "
            f"{_when(q['resets_at'])}",
        )
    n = state.get("notice")
    if n:
        heading = n.get("heading") or "This GPU will be reclaimed"
        # the time as well as the countdown: a widget whose kernel went with the reclaim stays
        # on the page as last drawn, and "at 12:05 UTC" is still true there, "in 0:12" not
        parts["notice"] = (
            f'<p role="alert"><b>{e(heading)}</b> — reclaimed at {_clock(n["deadline"])} '
            f"(in {_countdown(n['deadline'], now)}) because {e(n['reason'])}; then "
            f"{e(_action_text(n.get('action') or 'stop'))}.</p>"
        )
        if n.get("why_not_kept"):
            parts["notice"] += f"<p>{e(n['why_not_kept'])}.</p>"
    return parts


class GPUPoolWidget(widgets.VBox):  # type: ignore[misc]  # ipywidgets ships no type information
    """The GPU panel inside a notebook: ``GPUPoolWidget()`` as a cell's last line."""

    def __init__(self, interval: float = 5.0, **kwargs: Any) -> None:
        self.interval = interval
        self._lease = widgets.HTML()
        self._activity = widgets.HTML()
        self._quota = widgets.HTML()
        self._notice = widgets.HTML()
        self._keep = widgets.Button(
            description="Keep my GPU",
            tooltip="Extend the idle notice: the GPU stays yours",
            button_style="warning",
            layout=widgets.Layout(display="none"),
        )
        self._message = widgets.HTML()
        self._keep.on_click(self._on_keep)
        super().__init__(
            [self._lease, self._activity, self._quota, self._notice, self._keep, self._message],
            **kwargs,
        )
        self.state: dict[str, Any] = {}
        self._task: asyncio.Task[None] | None = None
        self.refresh()
        with contextlib.suppress(RuntimeError):  # no running loop: a one-off picture
            self._task = asyncio.get_running_loop().create_task(self._poll())

    def refresh(self) -> None:
        """Read the state once and show it."""
        try:
            self.show(status())
        except Exception as e:
            self._message.value = f'<p role="status">{html.escape(str(e))}</p>'

    def show(self, state: dict[str, Any]) -> None:
        self.state = state
        parts = render(state)
        self._lease.value = parts["lease"]
        self._activity.value = parts["activity"]
        self._quota.value = parts["quota"]
        self._notice.value = parts["notice"]
        notice = state.get("notice") or {}
        keep = notice.get("keep", notice.get("extendable", False)) if notice else False
        # a Keep button only where keeping is allowed; otherwise the notice says why not
        self._keep.layout.display = "" if keep else "none"
        self._keep.disabled = not keep

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.show(await loop.run_in_executor(None, status))
            except Exception as e:
                self._message.value = f'<p role="status">{html.escape(str(e))}</p>'

    def _on_keep(self, _: Any) -> None:
        try:
            self.show(call("POST", "keepalive", {}))
            self._message.value = "<p>Kept: the GPU stays yours.</p>"
        except Exception as e:
            self._message.value = f'<p role="status">Not kept: {html.escape(str(e))}</p>'

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        super().close()
