"""The spawn page's GPU picker: the ``user_options`` keys it sets, the offers as it shows them
(availability, wait, quota fit) and the form rendered from them. Kept apart from the spawner's
lease lifecycle (``base.py``) so the page's wording and template change in one place."""

from __future__ import annotations

import os
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from jupyterhub_gpupool.pool.codes import picker_reason
from jupyterhub_gpupool.wording import units_text

#: ``user_options`` key holding the chosen offer name; ``""`` means no GPU (CPU only).
OPTION = "gpupool_offer"
#: ``user_options`` keys of an ask for approval: why, and for how many hours.
REASON_OPTION = "gpupool_reason"
DURATION_OPTION = "gpupool_duration_hours"

_TEMPLATES = os.path.join(os.path.dirname(__file__), "templates")
_jinja = Environment(
    loader=FileSystemLoader(_TEMPLATES), autoescape=select_autoescape(default=True)
)


def wait_text(seconds: float | None) -> str:
    """A human estimate of a wait: "about 4 minutes", or "no estimate yet"."""
    if seconds is None:
        return "no estimate yet"
    if seconds < 60:
        return "less than a minute"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"about {minutes} minute{'s' if minutes != 1 else ''}"
    return f"about {seconds / 3600:.1f} hours"


def annotate(offers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pool's offers with what the picker shows of each: units and wait in words, whether
    it can be chosen, why not, and whether choosing it asks for approval (changed in place)."""
    for o in offers:
        o["units_text"] = units_text(o["units"])
        o["wait_text"] = wait_text(o.get("eta_seconds"))
        o["selectable"] = o.get("quota_ok") is not False or bool(o.get("exception_ok"))
        o["why_not"] = picker_reason(o.get("quota_reason"))
        o["needs_ask"] = o.get("approval") == "required" or (
            o.get("quota_ok") is False and bool(o.get("exception_ok"))
        )
    return offers


def render(choices: dict[str, Any], selected: str, allow_cpu_only: bool) -> str:
    """The options form for ``choices`` (``GPUPoolSpawnerMixin.gpupool_choices``) with
    ``selected`` checked, or the first offer that can be chosen when it cannot be."""
    names = {o["name"] for o in choices["offers"] if o["selectable"]}
    if selected not in names and not (selected == "" and allow_cpu_only):
        selected = next(iter(sorted(names)), "") if not allow_cpu_only else ""
    return _jinja.get_template("gpupool_form.html").render(
        option=OPTION,
        offers=choices["offers"],
        quota=choices["quota"],
        error=choices["error"],
        allow_cpu_only=allow_cpu_only,
        selected=selected,
        units_text=units_text,
        reason_option=REASON_OPTION,
        duration_option=DURATION_OPTION,
        asks=any(o.get("needs_ask") for o in choices["offers"]),
    )
