"""When a request waits for an administrator, and what an approval may change.

Two things put a request before an administrator (state ``awaiting_approval``):

* its offer says ``approval: required`` (an 8× H100 node, say): every request for it, with the
  user's reason;
* it is beyond its owner's quota limit and the user asks for an *exception* (a reason and a
  duration), which a quota allows up to its exception ceiling.

Nothing is held while a request waits. An approval puts it in the normal queue (an exception
request is then held to the ceiling instead of the limit, for the approved duration); a denial
ends it. The rules are values over the allocator's decision, so the store, the what-if replay
and the tests all ask this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

from .allocator import Allocator
from .decisions import Decision, Queued, Rejected
from .errors import Refusal
from .model import Request

#: The shortest and longest duration one may ask for (a minute, a year).
MIN_DURATION = 60.0
MAX_DURATION = 366 * 86400.0
#: The longest reason kept (the API's limit on every string).
MAX_REASON = 255
#: Limit verdicts an exception can lift (a budget or a missing quota it cannot).
LIMIT_CODES = ("exceeds_limit", "over_limit")


class AskError(Refusal):
    """An ask for approval that cannot be taken as it is (the field says what to fix)."""


@dataclass(frozen=True)
class Ask:
    """Why a request waits for approval, and what it would hold once approved."""

    required_by: tuple[str, ...]  # "offer" and/or "quota"
    exception: bool
    units: Fraction
    ceiling: Fraction | None
    message: str


def check_ask(reason: str, duration: object) -> str:
    """Validate a request's ``reason`` and ``duration`` (seconds); the reason, stripped."""
    if not isinstance(reason, str):
        raise AskError("invalid_field", "must be a string", field="reason")
    reason = reason.strip()
    if len(reason) > MAX_REASON:
        raise AskError("invalid_field", f"at most {MAX_REASON} characters", field="reason")
    if duration is not None and (
        isinstance(duration, bool)
        or not isinstance(duration, (int, float))
        or not math.isfinite(duration)
        or not MIN_DURATION <= duration <= MAX_DURATION
    ):
        raise AskError(
            "invalid_field",
            f"must be {MIN_DURATION:g} s to {MAX_DURATION:g} s (a minute to 366 days)",
            field="duration",
        )
    return reason


def _units(decision: Decision) -> Fraction | None:
    return None if isinstance(decision, Rejected) else decision.units


def approval_needed(
    alloc: Allocator,
    request: Request,
    decision: Decision,
    reason: str,
    duration: float | None,
    now: float,
) -> Ask | None:
    """Whether ``request`` (decided as ``decision``) must wait for an administrator.

    None: it goes on as decided (granted, queued or refused). Raises ``AskError`` when the ask
    is incomplete or beyond what an approval could ever allow."""
    offer = alloc.offers.get(request.offer)
    if offer is None:
        return None
    code = decision.code if isinstance(decision, (Rejected, Queued)) else None
    limited = code in LIMIT_CODES
    required = offer.approval == "required"
    if isinstance(decision, Rejected) and not limited:
        return None  # refused for what no approval changes (hardware, cluster, budget)
    ceiling = alloc.quotas.exception_ceiling(request.user, request.groups, request.group)
    exception, units = False, _units(decision)
    if limited and reason and ceiling is not None:
        lifted = alloc.decide(replace(request, exception=True), now)
        if isinstance(lifted, Rejected):
            if lifted.code in LIMIT_CODES:
                raise AskError(
                    "exceeds_exception_ceiling",
                    f"beyond the exception ceiling of {float(ceiling):g} units: {lifted.message}",
                    field="offer",
                    allowed=[float(ceiling)],
                )
            raise AskError(lifted.code, lifted.message, field=lifted.field, allowed=lifted.allowed)
        if duration is None:
            raise AskError(
                "missing_field",
                "an exception request needs a duration (seconds): it lapses then",
                field="duration",
            )
        exception, units = True, _units(lifted)
    elif limited and isinstance(decision, Rejected):
        hint = (
            f"no quota of {request.user}'s allows exceptions"
            if ceiling is None
            else f"an exception up to {float(ceiling):g} units can be asked for with a reason "
            "and a duration"
        )
        raise AskError(decision.code, f"{decision.message}; {hint}", field="offer")
    if not (required or exception):
        return None  # decided as usual (a request over the limit waits for the user's leases)
    if not reason:
        raise AskError(
            "missing_field",
            f"offer {offer.name!r} needs an administrator's approval: say why (reason)",
            field="reason",
        )
    by = (("offer",) if required else ()) + (("quota",) if exception else ())
    what = "an exception to your quota" if exception else f"{offer.display_name or offer.name}"
    return Ask(
        by,
        exception,
        units or Fraction(0),
        ceiling if exception else None,
        f"waiting for an administrator to approve {what}",
    )
