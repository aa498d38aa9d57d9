"""Users (quota, use, leases, notices), the pool inventory and utilization samples."""

from __future__ import annotations

import time
from datetime import timezone

from ...store import StoreError
from .base import APIError, APIHandler, lease_not_found


class UserHandler(APIHandler):
    """``GET users/{name}`` (or ``users/me``)."""

    route_name = "user"

    def get(self, name: str) -> None:
        ident = self.identity
        assert ident is not None
        if name == "me":
            if ident.kind != "user":
                raise APIError(404, "not_found", "services have no user page", field="name")
            name = ident.name
        self.require(ident.may_use_for(name), f"see {name}'s quota")
        groups = ident.groups if name == ident.name else ()
        self.write_json(self.store.user(name, groups))


class PoolHandler(APIHandler):
    """``GET pool``: admins see holders and GPUs; users see aggregates only."""

    route_name = "pool"

    def get(self) -> None:
        ident = self.identity
        assert ident is not None
        self.require(ident.may_use or ident.is_agent, "see the pool")
        self.write_json(self.store.pool(detail=ident.is_admin))


class UtilizationHandler(APIHandler):
    """``GET utilization?lease=&since=``: recent samples of a lease's devices (or all, admins)."""

    route_name = "utilization"

    def get(self) -> None:
        ident = self.identity
        assert ident is not None
        lease_id = self.get_argument("lease", None)
        since_dt = self.time_arg("since")
        since = since_dt.replace(tzinfo=timezone.utc).timestamp() if since_dt else time.time() - 900
        buffer = self.settings["utilization"]
        if lease_id is None:
            self.require_admin("read every GPU's utilization")
            with self.store.locked() as alloc:
                devices = [(g, None) for g in alloc.gpus]
                devices += [(g.uuid, i.start) for g in alloc.gpus.values() for i in g.instances]
        else:
            self.require(ident.may_use, "read utilization")
            try:
                owner = self.store.lease_owner(lease_id)
            except StoreError:
                raise lease_not_found(lease_id, "lease") from None
            if not ident.may_use_for(owner):
                raise lease_not_found(lease_id, "lease")
            lease = self.store.lease(lease_id)
            devices = [
                (s["gpu"], s["start"] if s["kind"] == "mig" else None) for s in lease["slots"]
            ]
        samples = buffer.series(devices, since)
        self.write_json({"lease": lease_id, "samples": [s.to_json() for s in samples]})


default_handlers = [
    (r"users/([^/]+)", UserHandler),
    (r"pool", PoolHandler),
    (r"utilization", UtilizationHandler),
]
