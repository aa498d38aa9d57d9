"""GPU kernels: a notebook kernel holding a lease of its own, asked for by its user's server
(the ``gpupool`` kernel provisioner, with the server's token: ``custom:gpupool:use``).

``POST kernels {offer, kernel_id}`` (granted or queued, with position and estimate),
``GET kernels`` (the caller's; an admin's ``?user=``), ``GET|DELETE kernels/{id}`` and
``POST kernels/{id}/activity {state}`` (the provisioner's heartbeat: busy, idle, starting).
A kernel that is not the caller's is answered as a missing one.
"""

from __future__ import annotations

from ...pool import commands
from ...pool.errors import PoolError
from ...store.kernels import kernel_not_found
from ..serialize.kernels import kernel_json
from .base import APIError, APIHandler, needs


class _KernelHandler(APIHandler):
    """Base of the handlers addressing one kernel as its user."""

    def _check(self, kernel_id: str) -> None:
        self.require_owner(self.store.kernel_owner(kernel_id), kernel_not_found(kernel_id))


class KernelsHandler(APIHandler):
    """``POST kernels`` (request a lease for a kernel) and ``GET kernels`` (list)."""

    route_name = "kernels"

    @needs("use", "request GPU kernels")
    async def post(self) -> None:
        ident = self.identity
        body = self.json_body(
            {
                "user": (str, False),
                "offer": (str, True),
                "kernel_id": (str, True),
                "group": ((str, type(None)), False),
            }
        )
        user = body.get("user") or (ident.name if ident.kind == "user" else None)
        if not user:
            raise APIError("missing_field", "user is required for services", field="user")
        self.require(ident.may_use_for(user), f"request GPU kernels for {user}")
        try:
            kernel = await self.writer.run(
                commands.RequestKernel(
                    user,
                    body["offer"],
                    body["kernel_id"],
                    group=body.get("group"),
                    groups=tuple(ident.groups),
                    actor=ident.describe(),
                )
            )
        except PoolError as e:  # counted for capacity planning, as an allocation's are
            if e.code not in ("invalid_field", "kernel_exists"):
                await self.writer.run(commands.RecordRefusal(body["offer"], e.code))
            raise
        self.set_header("Location", f"{self.request.path.rstrip('/')}/{body['kernel_id']}")
        self.write_json(kernel_json(kernel), 201)

    @needs("use", "list GPU kernels")
    def get(self) -> None:
        ident = self.identity
        user = self.get_argument("user", None)
        if user is None and not ident.is_spawner:
            user = ident.name
        if user is not None:
            self.require(ident.may_use_for(user), f"see {user}'s GPU kernels")
        self.write_json({"kernels": [kernel_json(k) for k in self.store.kernels(user=user)]})


class KernelHandler(_KernelHandler):
    """``GET kernels/{id}`` and ``DELETE kernels/{id}`` (release)."""

    route_name = "kernel"

    @needs("use", "read GPU kernels")
    def get(self, kernel_id: str) -> None:
        self._check(kernel_id)
        self.write_json(kernel_json(self.store.kernel(kernel_id)))

    @needs("use", "release GPU kernels")
    async def delete(self, kernel_id: str) -> None:
        self._check(kernel_id)
        actor = self.identity.describe()
        released = await self.writer.run(commands.ReleaseKernel(kernel_id, actor=actor))
        self.write_json(kernel_json(released))


class KernelActivityHandler(_KernelHandler):
    """``POST kernels/{id}/activity {state}``: the provisioner's report (its heartbeat)."""

    route_name = "kernel-activity"

    @needs("use", "report GPU kernel activity")
    async def post(self, kernel_id: str) -> None:
        self._check(kernel_id)
        body = self.json_body({"state": (str, True)})
        actor = self.identity.describe()
        self.write_json(
            kernel_json(
                await self.writer.run(
                    commands.KernelActivity(kernel_id, body["state"], actor=actor)
                )
            )
        )


default_handlers = [
    (r"kernels", KernelsHandler),
    (r"kernels/([^/]+)", KernelHandler),
    (r"kernels/([^/]+)/activity", KernelActivityHandler),
]
