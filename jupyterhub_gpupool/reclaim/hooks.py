"""A ``notify_hook`` that posts each reclaim event (and the pool service's approval events and
alerts) to a webhook (a chat channel, a mailer).

The example the docs name; use it as is or copy it::

    c.ReclaimerApp.notify_hook = "jupyterhub_gpupool.reclaim.hooks.webhook_from_env"

with ``GPUPOOL_RECLAIM_WEBHOOK=https://chat.example.org/hooks/…`` in the reclaimer's
environment, or build one with :func:`webhook`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

#: What each event says to the user, in one line.
MESSAGES = {
    "notice": "{user}: your GPU ({offer}) will be reclaimed at {deadline}: {reason}. "
    "Press 'Keep my GPU' to keep it.",
    "notice-kept-not": "{user}: your GPU ({offer}) will be reclaimed at {deadline}: {reason}. "
    "{why}.",
    "cancel": "{user}: the reclaim of your GPU ({offer}) is off: {reason}.",
    "act": "{user}: reclaiming your GPU ({offer}) now ({action}): {reason}.",
    "done": "{user}: your GPU ({offer}) was reclaimed ({action}); saved: {saved}.",
    "failed": "{user}: the reclaim of your GPU ({offer}) failed; you keep it: {detail}.",
    # the pool service's approvals (PoolService.notify_hook)
    "approval-requested": "{user} asks for {offer}: {reason}. Approve or deny it on the "
    "admin panel's Approvals page.",
    "approved": "{user}: your request for {offer} was approved by {by}.",
    "denied": "{user}: your request for {offer} was denied by {by}: {reason}.",
    "notice-cancelled": "{user}: {by} withdrew the reclaim notice on your GPU ({offer}); "
    "you keep it: {reason}.",
}


def message(event: str, lease: dict[str, Any], decision: dict[str, Any]) -> str:
    """The one line a person reads for ``event``."""
    if event in ("alert", "alert-resolved"):  # the pool service's own alerts
        state = "RESOLVED" if event == "alert-resolved" else decision.get("severity", "")
        return f"[{state}] {decision.get('summary', '')} (since {decision.get('since', '?')})"
    outcome = decision.get("outcome") or {}
    fields = {
        "user": decision.get("user") or lease.get("user", "?"),
        "offer": decision.get("offer_name")
        or lease.get("offer_name")
        or decision.get("offer")
        or lease.get("offer", "?"),
        "deadline": decision.get("deadline") or "(soon)",
        "reason": decision.get("reason")
        or (lease.get("approval") or {}).get("note")
        or (lease.get("approval") or {}).get("reason", ""),
        "by": decision.get("by", "an administrator"),
        "action": decision.get("action", ""),
        "saved": ", ".join(outcome.get("saved") or []) or "nothing open",
        "detail": outcome.get("detail", ""),
    }
    text = MESSAGES.get(event, "{user}: " + event).format(**fields)
    if event == "notice" and decision.get("keep") is False:  # no "Keep my GPU" to press
        text = MESSAGES["notice-kept-not"].format(**fields, why=decision.get("why_not_kept"))
    if event == "notice" and decision.get("heading"):
        text = f"{decision['heading']}. {text}"
    return text


def webhook(
    url: str, *, timeout: float = 10.0, headers: dict[str, str] | None = None
) -> Callable[[str, dict[str, Any], dict[str, Any]], Awaitable[None]]:
    """An async ``notify_hook`` posting ``{"text", "event", "lease", "decision"}`` as JSON to
    ``url`` (the ``text`` field is what Slack/Mattermost-style incoming webhooks show). A
    non-2xx answer raises, which the reclaimer logs and counts."""

    async def hook(event: str, lease: dict[str, Any], decision: dict[str, Any]) -> None:
        body = {
            "text": message(event, lease, decision),
            "event": event,
            "lease": lease,
            "decision": decision,
        }
        await AsyncHTTPClient().fetch(
            HTTPRequest(
                url,
                method="POST",
                headers={"Content-Type": "application/json", **(headers or {})},
                body=json.dumps(body),
                request_timeout=timeout,
            )
        )

    return hook


async def webhook_from_env(event: str, lease: dict[str, Any], decision: dict[str, Any]) -> None:
    """:func:`webhook` to ``$GPUPOOL_RECLAIM_WEBHOOK`` (nothing when it is unset)."""
    url = os.environ.get("GPUPOOL_RECLAIM_WEBHOOK")
    if url:
        await webhook(url)(event, lease, decision)
