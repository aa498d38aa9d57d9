"""Users (quota, use, leases, notices), the pool inventory and utilization samples."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from ...store import StoreError, lease_not_found
from ..serialize.poolmap import pool_json
from ..serialize.users import user_json
from ..serialize.utilization import minute_json
from ..utilization import minute_of
from .base import APIError, APIHandler, needs


class UserHandler(APIHandler):
    """``GET users/{name}`` (or ``users/me``)."""

    route_name = "user"

    @needs("identified", "see quotas")
    def get(self, name: str) -> None:
        ident = self.identity
        if name == "me":
            if ident.kind != "user":
                raise APIError("not_found", "services have no user page", field="name")
            name = ident.name
        self.require(ident.may_use_for(name), f"see {name}'s quota")
        groups = ident.groups if name == ident.name else ()
        self.write_json(user_json(self.store.user(name, groups, **self.lease_hub_filter)))


class PoolHandler(APIHandler):
    """``GET pool``: admins see holders and GPUs; users see aggregates only."""

    route_name = "pool"

    @needs("use-or-agent", "see the pool")
    def get(self) -> None:
        self.write_json(pool_json(self.store.pool(detail=self.identity.is_admin)))


class UtilizationHandler(APIHandler):
    """``GET utilization?lease=&since=&resolution=``: a lease's devices (or all, admins).

    Full-rate samples come from memory (the last ``utilization_window`` seconds); one-minute
    aggregates from the database are added as ``minutes`` with ``resolution=minute`` or when
    ``since`` reaches back past the in-memory window (unless ``resolution=sample``).
    """

    route_name = "utilization"

    @needs("identified", "read utilization")
    def get(self) -> None:
        ident = self.identity
        lease_id = self.get_argument("lease", None)
        since_dt = self.time_arg("since")
        resolution = self.get_argument("resolution", None)
        if resolution not in (None, "sample", "minute"):
            raise APIError(
                "invalid_argument",
                "resolution must be sample or minute",
                field="resolution",
                allowed=["sample", "minute"],
            )
        now = time.time()
        since = since_dt.replace(tzinfo=timezone.utc).timestamp() if since_dt else now - 900
        buffer = self.settings["utilization"]
        devices: list[tuple[str, int | None]] | None
        window: tuple[datetime | None, datetime | None] = (None, None)
        if lease_id is None:
            self.require(ident.is_admin, "read every GPU's utilization")
            devices = self.store.devices()
        else:
            self.require(ident.may_use, "read utilization")
            try:
                visible = self.may_see_lease(lease_id)
            except StoreError:
                raise lease_not_found(lease_id, "lease") from None
            if not visible:
                raise lease_not_found(lease_id, "lease")
            lease = self.store.lease(lease_id)
            devices = [(s.gpu, s.start if s.kind == "mig" else None) for s in lease.slots]
            window = (_minute_or_none(lease.granted), _minute_or_none(lease.released))
        samples = buffer.series(devices, since)
        out: dict[str, object] = {"lease": lease_id, "samples": [s.to_json() for s in samples]}
        if resolution == "minute" or (resolution is None and since < now - buffer.window):
            # a lease sees its devices' minutes while it held them, never a previous holder's
            start = minute_of(since)
            if window[0] is not None:
                start = max(start, window[0])
            out["minutes"] = [
                minute_json(m)
                for m in self.store.minutes(
                    devices if lease_id is not None else None, start, window[1]
                )
            ]
        self.write_json(out)


def _minute_or_none(moment: datetime | None) -> datetime | None:
    """The naive UTC minute of a time from the store (naive UTC; None stays None)."""
    if moment is None:
        return None
    return minute_of(moment.replace(tzinfo=timezone.utc).timestamp())


default_handlers = [
    (r"users/([^/]+)", UserHandler),
    (r"pool", PoolHandler),
    (r"utilization", UtilizationHandler),
]
