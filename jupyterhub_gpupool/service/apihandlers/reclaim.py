"""The reclaimer's endpoints (leader lock, watched leases, rounds, outcomes) and the admin's
reclaim policies.

The pool decides and the reclaimer acts: a round carries what the reclaimer saw of each lease's
server and user; the handler sends it through the writer, where the store reads the window's GPU
samples from the database (those every replica stored), plans and applies it in one
transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, overload

from ...pool import commands
from ...pool.reclaim import KERNEL_STATES, KernelView, PresenceView
from ...store.reclaim import Observation
from ..serialize.leases import lease_json, watched_lease_json
from ..serialize.reclaim import leader_json, reclaim_policy_json, round_json
from .base import APIError, APIHandler, needs

#: At most this many files in one outcome's ``saved``, each at most this long.
MAX_SAVED = 10_000
MAX_PATH = 4096


@overload
def _number(value: object, where: str, *, nullable: Literal[False] = False) -> float: ...


@overload
def _number(value: object, where: str, *, nullable: Literal[True]) -> float | None: ...


def _number(value: object, where: str, *, nullable: bool = False) -> float | None:
    """An epoch time (or another number) of the body; None only where ``nullable``."""
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a number or null" if nullable else "a number"
        raise APIError("invalid_field", f"{where} must be {kind}", field=where)
    if not 0 <= value < 1e11:  # epoch seconds up to year 5138
        raise APIError("invalid_field", f"{where} is out of range", field=where)
    return float(value)


def _fields(raw: object, where: str, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise APIError("invalid_field", f"{where} must be an object", field=where)
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise APIError(
            "invalid_field",
            f"{where} has unknown field(s): {', '.join(unknown)}",
            field=f"{where}.{unknown[0]}",
            allowed=sorted(allowed),
        )
    return raw


def parse_window(raw: dict[str, Any]) -> tuple[float, float]:
    """``{"start", "end"}`` in epoch seconds, ``end`` after ``start``."""
    window = _fields(raw, "window", ("start", "end"))
    for key in ("start", "end"):
        if key not in window:
            raise APIError("invalid_field", f"window.{key} is required", field=f"window.{key}")
    start, end = _number(window["start"], "window.start"), _number(window["end"], "window.end")
    if end <= start:
        raise APIError("invalid_field", "window.end must be after window.start", field="window")
    return start, end


def parse_observed(raw: dict[str, Any]) -> dict[str, Observation]:
    """What the reclaimer saw, lease by lease: the server's kernels and the user's presence
    (``null`` or left out: not seen, which the rules read as stale)."""
    out: dict[str, Observation] = {}
    for lease, seen in raw.items():
        where = f"observed.{lease}"
        seen = _fields(seen, where, ("kernel", "presence"))
        kernel = presence = None
        if seen.get("kernel") is not None:
            k = _fields(
                seen["kernel"], f"{where}.kernel", ("state", "last_activity", "observed_at")
            )
            if k.get("state") not in KERNEL_STATES:
                raise APIError(
                    "invalid_field",
                    f"{where}.kernel.state must be one of {', '.join(KERNEL_STATES)}",
                    field=f"{where}.kernel.state",
                    allowed=KERNEL_STATES,
                )
            kernel = KernelView(
                _number(k.get("observed_at"), f"{where}.kernel.observed_at"),
                k["state"],
                _number(k.get("last_activity"), f"{where}.kernel.last_activity", nullable=True),
            )
        if seen.get("presence") is not None:
            p = _fields(
                seen["presence"], f"{where}.presence", ("last_input", "connections", "observed_at")
            )
            connections = p.get("connections", 0)
            if isinstance(connections, bool) or not isinstance(connections, int) or connections < 0:
                raise APIError(
                    "invalid_field",
                    f"{where}.presence.connections must be a whole number >= 0",
                    field=f"{where}.presence.connections",
                )
            presence = PresenceView(
                _number(p.get("observed_at"), f"{where}.presence.observed_at"),
                _number(p.get("last_input"), f"{where}.presence.last_input", nullable=True),
                min(connections, 1_000_000),
            )
        out[str(lease)] = (kernel, presence)
    return out


class LeaderHandler(APIHandler):
    """``POST reclaim/leader`` (take or renew the lead) and ``DELETE reclaim/leader?holder=``."""

    route_name = "reclaim-leader"

    @needs("reclaim", "lead the reclaimer")
    async def post(self) -> None:
        body = self.json_body({"holder": (str, True), "ttl": ((int, float), False)})
        ttl = float(body.get("ttl", 60))
        taken = await self.writer.run(
            commands.TakeLeader(body["holder"], ttl, actor=self.identity.describe())
        )
        self.write_json(leader_json(taken))

    @needs("reclaim", "lead the reclaimer")
    async def delete(self) -> None:
        holder = self.get_argument("holder", None)
        if not holder:
            raise APIError("invalid_argument", "holder is required", field="holder")
        left = await self.writer.run(commands.GiveUpLeader(holder, actor=self.identity.describe()))
        self.write_json(leader_json(left))


class ReclaimLeasesHandler(APIHandler):
    """``GET reclaim/leases``: the live leases the reclaimer watches, with their notices."""

    route_name = "reclaim-leases"

    @needs("reclaim", "read the reclaimer's leases")
    def get(self) -> None:
        offset, limit = self.page_args()
        items, total = self.store.reclaim_leases(offset, limit)
        self.write_page([watched_lease_json(v) for v in items], total, offset, limit)


class RoundHandler(APIHandler):
    """``POST reclaim/rounds``: one window of every watched lease, decided by the pool."""

    route_name = "reclaim-rounds"

    @needs("reclaim", "run reclaim rounds")
    async def post(self) -> None:
        body = self.json_body(
            {"holder": (str, True), "window": (dict, True), "observed": (dict, False)}
        )
        window = parse_window(body["window"])
        observed = parse_observed(body.get("observed") or {})
        # no samples here: the round reads the window's from the database, every replica's
        answer = await self.writer.run(
            commands.ReclaimRound(body["holder"], window, observed, actor=self.identity.describe())
        )
        self.write_json(round_json(answer))


class OutcomeHandler(APIHandler):
    """``POST reclaim/leases/{id}/outcome``: the claimed action was carried out, or failed."""

    route_name = "reclaim-outcome"

    @needs("reclaim", "report reclaim outcomes")
    async def post(self, lease_id: str) -> None:
        body = self.json_body(
            {
                "holder": (str, True),
                "result": (str, True),
                "saved": (list, False),
                "detail": (str, False),
            }
        )
        saved = body.get("saved") or []
        if len(saved) > MAX_SAVED:
            raise APIError("invalid_field", f"saved lists over {MAX_SAVED} files", field="saved")
        for i, path in enumerate(saved):
            if not isinstance(path, str) or len(path) > MAX_PATH:
                raise APIError(
                    "invalid_field",
                    f"saved[{i}] must be a path of at most {MAX_PATH} characters",
                    field=f"saved[{i}]",
                )
        lease = await self.writer.run(
            commands.ReclaimOutcome(
                lease_id,
                body["holder"],
                body["result"],
                saved,
                body.get("detail", ""),
                actor=self.identity.describe(),
            )
        )
        self.write_json(lease_json(lease))


class PoliciesHandler(APIHandler):
    """``GET|PUT|DELETE reclaim/policies``: the admin's override of the ``reclaim`` section."""

    route_name = "reclaim-policies"

    @needs("admin", "read reclaim policies")
    def get(self) -> None:
        self.write_json(reclaim_policy_json(self.store.reclaim_policy()))

    @needs("admin", "change reclaim policies")
    async def put(self) -> None:
        body = self.json_body(
            {"default": (dict, False), "priority_classes": (dict, False), "offers": (dict, False)}
        )
        put = await self.writer.run(commands.PutReclaimPolicy(body, actor=self.identity.describe()))
        self.write_json(reclaim_policy_json(put))

    @needs("admin", "change reclaim policies")
    async def delete(self) -> None:
        reset = await self.writer.run(commands.ResetReclaimPolicy(actor=self.identity.describe()))
        self.write_json(reclaim_policy_json(reset))


default_handlers = [
    (r"reclaim/leader", LeaderHandler),
    (r"reclaim/leases", ReclaimLeasesHandler),
    (r"reclaim/leases/([^/]+)/outcome", OutcomeHandler),
    (r"reclaim/rounds", RoundHandler),
    (r"reclaim/policies", PoliciesHandler),
]
