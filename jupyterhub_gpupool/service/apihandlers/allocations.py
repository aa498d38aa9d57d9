"""Offers and allocations (leases): what users may ask for, and asking for it."""

from __future__ import annotations

from typing import Any

from ...hubclient import HubUnavailable
from ...pool import commands
from ...pool.errors import PoolError
from ...poolconfig import DNS_LABEL
from ...store import lease_not_found
from ...store.read.leases import LeaseView
from ..serialize.leases import lease_json, leases_json
from ..serialize.presence import presence_json, server_url_json
from .base import APIError, APIHandler, needs


class OffersHandler(APIHandler):
    """``GET offers``: the offers the caller may use, with live availability and quota fit."""

    route_name = "offers"

    @needs("use", "use the GPU pool")
    def get(self) -> None:
        ident = self.identity
        user = self.get_argument("user", None)
        groups = list(ident.groups)
        if user is not None and user != ident.name:
            self.require(ident.is_spawner, f"see offers for {user}")
            groups = self.get_arguments("group")
        elif ident.kind == "user":
            user = ident.name
        clusters = self.get_arguments("cluster", strip=False)  # as sent: "ok\n" is no label
        for name in clusters:  # malformed (empty, not a DNS label) is 400; unknown is 422
            if not DNS_LABEL.fullmatch(name):
                raise APIError(
                    "invalid_argument",
                    f"cluster {name!r} is not a DNS label (lower-case letters, digits and '-', "
                    "at most 63)",
                    field="cluster",
                )
        self.store.check_clusters(clusters, "cluster")
        self.write_json({"items": self.store.offers_for(user, groups, clusters)})


class AllocationsHandler(APIHandler):
    """``POST allocations`` (ask for a lease) and ``GET allocations`` (list them)."""

    route_name = "allocations"

    @needs("identified", "allocate GPUs")
    async def post(self) -> None:
        ident = self.identity
        body = self.json_body(
            {
                "user": (str, False),
                "server": (str, False),
                "offer": (str, True),
                "group": ((str, type(None)), False),
                "groups": (list, False),
                "priority": ((int, type(None)), False),
                "clusters": (list, False),
                "reason": (str, False),
                "duration": ((int, float, type(None)), False),
            }
        )
        user = body.get("user") or (ident.name if ident.kind == "user" else None)
        if not user:
            raise APIError("missing_field", "user is required for services", field="user")
        self.require(ident.may_use_for(user), f"allocate GPUs for {user}")
        server = body.get("server", "")
        if not ident.is_spawner:
            await self._check_server(user, server)
        groups = body.get("groups")
        if groups is not None and not all(isinstance(g, str) for g in groups):
            raise APIError("invalid_field", "groups must be a list of strings", field="groups")
        # users cannot claim groups they are not in; the spawner passes the user's groups
        member_of = groups if ident.is_spawner and groups is not None else list(ident.groups)
        priority = body.get("priority")
        if priority is not None:
            self.require(ident.is_spawner, "set a priority")
        clusters = body.get("clusters") or []
        if len(clusters) > 64 or not all(isinstance(c, str) and len(c) <= 63 for c in clusters):
            raise APIError(
                "invalid_field", "clusters must be at most 64 cluster names", field="clusters"
            )
        try:
            lease = await self._allocate(user, server, body, member_of, priority, clusters)
        except PoolError as e:  # counted for capacity planning (no lease row is written)
            await self.writer.run(commands.RecordRefusal(body["offer"], e.code))
            raise
        self.store.note_holder(lease.id, lease.user, lease.hub)
        out = lease_json(lease)
        if lease.state == "awaiting_approval":
            self.settings["notify"]("approval-requested", out)
        self.set_header("Location", f"{self.request.path.rstrip('/')}/{lease.id}")
        self.write_json(out, 201)

    async def _allocate(
        self,
        user: str,
        server: str,
        body: dict[str, Any],
        member_of: list[str],
        priority: int | None,
        clusters: list[str],
    ) -> LeaseView:
        ident = self.identity
        answer: LeaseView = await self.writer.run(
            commands.Allocate(
                user,
                server,
                body["offer"],
                group=body.get("group"),
                groups=member_of,
                priority=priority,
                actor=ident.describe(),
                clusters=clusters,
                reason=body.get("reason", ""),
                duration=body.get("duration"),
                hub=self.asking_hub,
            )
        )
        return answer

    async def _check_server(self, user: str, server: str) -> None:
        """A user asks for their own server only, one the hub knows: made-up server names
        cannot fill the queue (the spawner asks for servers the hub is spawning)."""
        if not self.settings.get("check_user_servers", True):
            return
        try:
            names = await self.settings["hub"].server_names(user)
        except HubUnavailable as e:
            raise APIError(
                "hub_unavailable", f"JupyterHub did not answer ({e}); try again"
            ) from None
        if names is None or server not in names:
            raise APIError(
                "unknown_server",
                f"{user} has no server {server!r} on the hub; start it from the hub first",
                field="server",
            )

    @needs("use", "use the GPU pool")
    def get(self) -> None:
        ident = self.identity
        user = self.get_argument("user", None)
        if user is None and not ident.is_spawner:
            user = ident.name
        if user is not None:
            self.require(ident.may_use_for(user), f"see {user}'s leases")
        offset, limit = self.page_args()
        items, total = self.store.leases(
            user=user,
            state=self.get_argument("state", None),
            offset=offset,
            limit=limit,
            **self.lease_hub_filter,
        )
        self.write_page(leases_json(items), total, offset, limit)


class _LeaseHandler(APIHandler):
    """Base of the handlers addressing one lease: hides other users' leases, and from a
    spawner the leases of other hubs.

    The scope is checked before the lease is looked up (``@needs("use")`` on each method), so
    a caller without it gets 403 whether or not the lease exists; a caller with it gets the
    same 404 for another user's lease (another hub's, for a spawner) as for a missing one.
    """

    def _check(self, lease_id: str, *, reading: bool = False) -> None:
        ident = self.identity
        if reading and ident.is_reclaimer:
            return  # may read any lease; a missing one is the store's 404
        if not self.may_see_lease(lease_id):
            raise lease_not_found(lease_id)


class AllocationHandler(_LeaseHandler):
    """``GET|DELETE allocations/{id}``: one lease; deleting releases it (or leaves the queue)."""

    route_name = "allocation"

    @needs("use-or-reclaim", "read leases")
    def get(self, lease_id: str) -> None:
        # the reclaimer reads a shrink's reserved target before it stops the server
        self._check(lease_id, reading=True)
        self.write_json(lease_json(self.store.lease(lease_id)))

    @needs("use", "release leases")
    async def delete(self, lease_id: str) -> None:
        self._check(lease_id)
        reason = self.get_argument("reason", "stopped")
        if reason not in ("stopped", "cancelled") and not self.identity.is_spawner:
            self.require(False, f"release with reason {reason!r}")
        actor = self.identity.describe()
        released = await self.writer.run(commands.Release(lease_id, reason=reason, actor=actor))
        # the release served the queue: a restart waiting on a target it granted goes now
        self.settings["restarts"].wake()
        self.write_json(lease_json(released))


class ResizeHandler(_LeaseHandler):
    """``POST allocations/{id}/resize {offer}``: reserve another offer before the restart."""

    route_name = "resize"

    @needs("use", "resize leases")
    async def post(self, lease_id: str) -> None:
        self._check(lease_id)
        body = self.json_body({"offer": (str, True)})
        actor = self.identity.describe()
        lease = await self.writer.run(commands.Resize(lease_id, body["offer"], actor=actor))
        self.write_json(lease_json(lease), 201)


class KeepaliveHandler(_LeaseHandler):
    """``POST allocations/{id}/keepalive``: the server runs on its lease (binds a grant)."""

    route_name = "keepalive"

    @needs("use", "keep leases alive")
    async def post(self, lease_id: str) -> None:
        self._check(lease_id)
        self.json_body({})
        actor = self.identity.describe()
        lease = await self.writer.run(commands.Keepalive(lease_id, actor=actor))
        self.write_json(lease_json(lease))


class PresenceHandler(_LeaseHandler):
    """``POST allocations/{id}/presence {idle_for}``: the server's lab reports the user's input
    (at most once a minute); from the first report on, only these reports are presence."""

    route_name = "presence"

    @needs("use", "report presence")
    async def post(self, lease_id: str) -> None:
        self._check(lease_id)
        body = self.json_body({"idle_for": ((int, float, type(None)), True)})
        actor = self.identity.describe()
        presence = await self.writer.run(
            commands.ReportPresence(lease_id, body["idle_for"], actor=actor)
        )
        self.write_json(presence_json(presence))


class ServerAddressHandler(_LeaseHandler):
    """``PUT allocations/{id}/server {url}``: the spawner says where the lease's server listens,
    so the reclaimer reads it there and not through the proxy (only the spawner: the reclaimer
    sends its token to that address)."""

    route_name = "server-address"

    @needs("spawn", "set server addresses")
    async def put(self, lease_id: str) -> None:
        self._check(lease_id)
        body = self.json_body({"url": (str, True)})
        actor = self.identity.describe()
        said = await self.writer.run(commands.SetServerUrl(lease_id, body["url"], actor=actor))
        self.write_json(server_url_json(said))


class DeviceHandler(_LeaseHandler):
    """``POST allocations/{id}/device {device}``: the device the lease's server really got
    (the agent from the kubelet's PodResources, a DRA spawner from its claim's allocation); the
    lease moves there, so idle judgement, the panel and chargeback follow it."""

    route_name = "device"

    @needs("spawn-or-agent", "rebind leases")
    async def post(self, lease_id: str) -> None:
        ident = self.identity
        if not ident.is_agent:  # a spawner: only the leases of its own hub
            self._check(lease_id)
        body = self.json_body(
            {"device": (str, False), "devices": (list, False), "exclusive": (bool, False)}
        )
        devices = body.get("devices")
        if "device" in body:
            devices = [body["device"]] if devices is None else None
        if (
            not devices
            or len(devices) > 64
            or not all(isinstance(d, str) and 0 < len(d) <= 255 for d in devices)
        ):
            raise APIError(
                "invalid_field",
                "give the device the server got (device) or, for a lease of several GPUs, "
                "every one of them (devices: 1 to 64 ids)",
                field="device",
            )
        actor = ident.describe()
        exclusive = bool(body.get("exclusive", False))
        lease = await self.writer.run(commands.Rebind(lease_id, devices, exclusive, actor=actor))
        self.write_json(lease_json(lease))


default_handlers = [
    (r"offers", OffersHandler),
    (r"allocations", AllocationsHandler),
    (r"allocations/([^/]+)", AllocationHandler),
    (r"allocations/([^/]+)/resize", ResizeHandler),
    (r"allocations/([^/]+)/keepalive", KeepaliveHandler),
    (r"allocations/([^/]+)/presence", PresenceHandler),
    (r"allocations/([^/]+)/server", ServerAddressHandler),
    (r"allocations/([^/]+)/device", DeviceHandler),
]
