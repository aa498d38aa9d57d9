"""The one client of the pool service's REST API v1: the spawners, the reclaimer, the node agent
and the lab server extension (``jupyterlab_gpupool.pool``) all call the pool through it.

It speaks HTTP only, through a *transport* (tornado's ``AsyncHTTPClient`` by default, which
the hub, the lab and the agent already run on; tests pass an in-memory one), and turns answers
into plain values or into one small exception tree, so callers can tell a refusal they should
show (:class:`PoolRefused`) from a pool that is not there right now (:class:`PoolUnavailable`)::

    PoolClientError
    ├── PoolUnavailable   no answer (refused, reset, DNS, timeout), 502/503/504, or an answer
    │                     that is not the pool's JSON: try again later
    └── PoolRefused       any other 3xx/4xx/5xx, with the service's ``code``, ``message``,
                          ``field`` and ``allowed``

It imports nothing heavy (no SQLAlchemy, no store): the lab package depends on this
distribution for it, in every user image (``tests/unit/test_poolclient.py`` checks). Every
method's (HTTP method, path) and request body is checked against the OpenAPI spec
(``tests/unit/test_poolclient_spec.py``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import quote, urlencode

from .logredact import redact


class PoolClientError(Exception):
    """Any failure talking to the pool service."""

    def __init__(self, message: str, *, status: int = 0, code: str = "", field: str | None = None):
        message = redact(message)  # it reaches logs and the spawn page: never with a token
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.field = field


class PoolUnavailable(PoolClientError):
    """The service could not be reached or said it is temporarily unavailable."""


class PoolRefused(PoolClientError):
    """The service answered with an error (quota, unknown offer, not allowed, ...)."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str,
        field: str | None = None,
        allowed: list[Any] | None = None,
    ):
        super().__init__(message, status=status, code=code, field=field)
        self.allowed = allowed


class Transport(Protocol):
    """One HTTP request: ``(status, body)`` for any answer; raises when there is none."""

    def __call__(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None
    ) -> Awaitable[tuple[int, bytes]]: ...


class TornadoTransport:
    """The default transport: tornado's ``AsyncHTTPClient``. It never follows a redirect: the
    request carries a token, which must not go wherever a ``Location`` points."""

    def __init__(
        self, timeout: float = 10.0, validate_cert: bool = True, ca_file: str | None = None
    ) -> None:
        self.timeout = timeout
        self.validate_cert = validate_cert
        self.ca_file = ca_file or None

    async def __call__(
        self, method: str, url: str, headers: dict[str, str], body: bytes | None
    ) -> tuple[int, bytes]:
        """Send the request; connection errors and timeouts raise."""
        from tornado.httpclient import AsyncHTTPClient, HTTPRequest

        req = HTTPRequest(
            url,
            method=method,
            headers=headers,
            body=body,
            allow_nonstandard_methods=body is None and method in ("POST", "PUT", "PATCH"),
            connect_timeout=self.timeout,
            request_timeout=self.timeout,
            follow_redirects=False,
            validate_cert=self.validate_cert,
            ca_certs=self.ca_file,
        )
        resp = await AsyncHTTPClient().fetch(req, raise_error=False)
        if resp.code == 599:  # tornado's code for "no HTTP answer at all"
            raise ConnectionError(str(resp.error))
        return resp.code, resp.body or b""


def _error_of(data: Any) -> dict[str, Any] | None:
    """The error object of an answer: the pool's ``{"error": {...}}``, or JupyterHub's own
    ``{"status", "message"}`` (its token checks answer so before the pool sees the request)."""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        error: dict[str, Any] = data["error"]
        return error
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return data
    return None


def _path(*parts: str) -> str:
    """A path of quoted segments (a lease id or user name never splits the path)."""
    return "/".join(quote(p, safe="") for p in parts)


class PoolClient:
    """Calls ``{api_url}/…`` with an API token (``Authorization: token …``) and counts its
    requests (``requests``: what the lab's fan-out test and the benchmark read)."""

    def __init__(
        self,
        api_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        transport: Transport | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/") + "/"
        self.token = token
        self.timeout = timeout
        self.transport: Transport = transport or TornadoTransport(timeout)
        self.requests = 0

    @property
    def headers(self) -> dict[str, str]:
        """What every request carries: the token, and JSON both ways."""
        return {
            "Authorization": f"token {self.token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    ) -> Any:
        """One call; the decoded JSON answer (None for an empty one)."""
        url = self.api_url + path
        if params:
            items = params.items() if isinstance(params, Mapping) else params
            query = [(k, v) for k, v in items if v is not None]
            if query:
                url += "?" + urlencode(query)
        self.requests += 1
        try:
            status, raw = await self.transport(
                method, url, self.headers, None if body is None else json.dumps(body).encode()
            )
        except Exception as e:  # refused, reset, DNS, timeout: all mean "not there now"
            why = getattr(e, "strerror", None) or str(e) or type(e).__name__
            raise PoolUnavailable(
                f"the GPU pool could not be reached at {self.api_url} ({why})"
            ) from e
        text = raw.decode("utf-8", "replace") if raw else ""
        try:
            data = json.loads(text) if text else None
            parsed = True
        except ValueError:
            data, parsed = None, False
        if status < 300:
            if not parsed:  # a proxy's or a login page: not the pool
                raise PoolUnavailable(
                    f"the GPU pool answered something that is not JSON (HTTP {status})",
                    status=status,
                )
            return data
        err = _error_of(data) or {}
        code = str(err.get("code") or "")
        if status in (502, 503, 504):
            message = str(err.get("message") or f"the GPU pool is not answering (HTTP {status})")
            raise PoolUnavailable(message, status=status, code=code)
        if status < 400:
            message = f"the GPU pool answered a redirect (HTTP {status}): check its API URL"
        else:
            message = str(
                err.get("message") or f"the GPU pool answered HTTP {status}: {text[:200]}"
            )
        raise PoolRefused(
            message,
            status=status,
            code=code,
            field=err.get("field"),
            allowed=err.get("allowed"),
        )

    async def _object(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """``request`` for the calls whose answer is a JSON object (the API's contract)."""
        answer: dict[str, Any] = await self.request(method, path, body, params)
        return answer

    # -- offers, leases and users: the spawners, the lab, the reclaimer ---------------------------

    async def offers(
        self, user: str | None = None, groups: Iterable[str] = (), clusters: Iterable[str] = ()
    ) -> list[dict[str, Any]]:
        """Offers ``user`` may use (the token's own user without one), with availability, queue
        length, units and quota fit (for a hub launching into ``clusters``: only the offers it
        can serve, counted there)."""
        params: list[tuple[str, Any]] = [("user", user)] + [("group", g) for g in groups]
        params += [("cluster", c) for c in clusters]
        return list((await self.request("GET", "offers", params=params) or {}).get("items") or [])

    async def allocate(
        self,
        user: str | None,
        server: str,
        offer: str,
        *,
        groups: Iterable[str] | None = None,
        group: str | None = None,
        clusters: Iterable[str] = (),
        reason: str = "",
        duration: float | None = None,
    ) -> dict[str, Any]:
        """Ask for ``offer`` for ``user``'s ``server`` (``user`` None: the token's own): a
        lease, granted or queued (only in ``clusters``, when given), or awaiting approval
        (``reason``, ``duration``: an ask an administrator decides on)."""
        body: dict[str, Any] = {"server": server, "offer": offer}
        if user is not None:
            body = {"user": user, **body}
        if reason:
            body["reason"] = reason
        if duration is not None:
            body["duration"] = duration
        if groups is not None:
            body["groups"] = list(groups)
        clusters = list(clusters)
        if clusters:
            body["clusters"] = clusters
        if group is not None:
            body["group"] = group
        return await self._object("POST", "allocations", body)

    async def lease(self, lease_id: str) -> dict[str, Any]:
        """One lease."""
        return await self._object("GET", _path("allocations", lease_id))

    async def leases(
        self, user: str | None = None, state: str | None = None, limit: int = 200
    ) -> list[dict[str, Any]]:
        """Leases, newest first (one page is plenty for one user's servers)."""
        params = {"user": user, "state": state, "limit": limit}
        page = await self._object("GET", "allocations", params=params)
        items: list[dict[str, Any]] = page["items"]
        return items

    async def release(self, lease_id: str, reason: str = "stopped") -> dict[str, Any]:
        """Give a lease back (or leave the queue with ``reason="cancelled"``)."""
        return await self._object(
            "DELETE", _path("allocations", lease_id), params={"reason": reason}
        )

    async def keepalive(self, lease_id: str) -> dict[str, Any]:
        """The server runs on its lease: binds a grant (granted → active); on a reclaim notice,
        Keep my GPU."""
        return await self._object("POST", _path("allocations", lease_id, "keepalive"), {})

    async def set_server_url(self, lease_id: str, url: str) -> dict[str, Any]:
        """Where the lease's server listens (the spawner): the reclaimer reads it there."""
        return await self._object("PUT", _path("allocations", lease_id, "server"), {"url": url})

    async def report_presence(self, lease_id: str, idle_for: float | None) -> dict[str, Any]:
        """The user's last input was ``idle_for`` seconds ago (the lab's report; None: the lab
        runs, no input yet)."""
        path = _path("allocations", lease_id, "presence")
        return await self._object("POST", path, {"idle_for": idle_for})

    async def rebind(
        self, lease_id: str, device: str | Sequence[str], *, exclusive: bool = False
    ) -> dict[str, Any]:
        """The lease's server got ``device`` (a GPU uuid, a MIG device uuid or a replica id;
        a lease of several GPUs: all of them), not necessarily what the pool chose: the lease
        moves there (``POST allocations/{id}/device``). ``exclusive`` (DRA): a device another
        lease holds is refused (409 ``device_held``), not swapped. Returns the lease."""
        if isinstance(device, str):
            body: dict[str, Any] = {"device": device}
        else:
            ids = list(device)
            body = {"device": ids[0]} if len(ids) == 1 else {"devices": ids}
        if exclusive:
            body["exclusive"] = True
        return await self._object("POST", _path("allocations", lease_id, "device"), body)

    async def resize(self, lease_id: str, offer: str) -> dict[str, Any]:
        """Reserve ``offer`` as the lease's target (the lab's move to another GPU)."""
        return await self._object(
            "POST", _path("allocations", lease_id, "resize"), {"offer": offer}
        )

    async def restart(self, lease_id: str) -> dict[str, Any]:
        """Have the pool restart the lease's server into its reserved target."""
        return await self._object("POST", _path("allocations", lease_id, "restart"), {})

    async def user(self, name: str) -> dict[str, Any]:
        """A user's quota, use, leases and notices (``me``: the token's own user)."""
        return await self._object("GET", _path("users", name))

    async def utilization(
        self, lease_id: str, since: str | None = None, resolution: str | None = "sample"
    ) -> dict[str, Any]:
        """A lease's recent samples (``since``: ISO 8601 or epoch seconds)."""
        params = {"lease": lease_id, "since": since, "resolution": resolution}
        answer: dict[str, Any] = await self.request("GET", "utilization", params=params) or {}
        return answer

    # -- the calls the reclaimer makes -------------------------------------------------------

    async def take_reclaim_lead(self, holder: str, ttl: float = 60.0) -> dict[str, Any]:
        """Take or renew the reclaimer's leader lock; another holder's raises ``PoolRefused``
        with code ``not_leader``."""
        return await self._object("POST", "reclaim/leader", {"holder": holder, "ttl": ttl})

    async def give_up_reclaim_lead(self, holder: str) -> dict[str, Any]:
        """Give the leader lock up (a replica that stops lets the next one lead at once)."""
        return await self._object("DELETE", "reclaim/leader", params={"holder": holder})

    async def reclaim_leases(self, page_size: int = 200) -> list[dict[str, Any]]:
        """Every lease the reclaimer watches (``active`` or ``reclaiming``), all pages."""
        items: list[dict[str, Any]] = []
        offset = 0
        while True:
            page = await self.request(
                "GET", "reclaim/leases", params={"offset": offset, "limit": page_size}
            )
            items += page["items"]
            offset += len(page["items"])
            if not page["items"] or offset >= page["total"]:
                return items

    async def reclaim_round(
        self, holder: str, window: tuple[float, float], observed: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Post one window's observations; the pool answers its decisions."""
        body = {
            "holder": holder,
            "window": {"start": window[0], "end": window[1]},
            "observed": dict(observed),
        }
        return await self._object("POST", "reclaim/rounds", body)

    async def reclaim_outcome(
        self, lease_id: str, holder: str, result: str, saved: Iterable[str] = (), detail: str = ""
    ) -> dict[str, Any]:
        """Report a claimed action done or failed (``saved``: the files saved first)."""
        return await self._object(
            "POST",
            _path("reclaim", "leases", lease_id, "outcome"),
            {"holder": holder, "result": result, "saved": list(saved), "detail": detail},
        )

    # -- the calls the node agent makes ------------------------------------------------------

    async def put_inventory(self, node: str, inventory: Mapping[str, Any]) -> dict[str, Any]:
        """The node's GPUs as NVML found them."""
        return await self._object("PUT", _path("nodes", node, "inventory"), dict(inventory))

    async def post_samples(self, node: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
        """A batch of utilization samples; the answer carries the node's MIG plan."""
        return await self._object("POST", _path("nodes", node, "samples"), {"samples": samples})

    async def post_mig_results(self, node: str, results: list[dict[str, Any]]) -> dict[str, Any]:
        """What became of the MIG actions the node applied."""
        return await self._object("POST", _path("nodes", node, "mig-results"), {"results": results})

    # -- jobs: the user's side (CLI, notebook API) and the job runner's ------------------------

    async def submit_job(
        self,
        offer: str,
        command: Sequence[str],
        *,
        workload: str = "training",
        name: str | None = None,
        group: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        image: str | None = None,
        replicas: int = 1,
    ) -> dict[str, Any]:
        """Submit ``command`` (program, then arguments) for ``offer`` as a job of class
        ``workload`` (``user``: a spawner's or admin's, for another user; ``cwd``: the folder
        to run it in where the runner's machine has it; ``image``: Kubernetes runs it in that
        container image; ``replicas``: copies of the offer, class inference): the job, granted
        or queued."""
        body: dict[str, Any] = {"offer": offer, "class": workload, "command": list(command)}
        if replicas != 1:
            body["replicas"] = replicas
        pairs = (("name", name), ("group", group), ("user", user), ("cwd", cwd), ("image", image))
        for key, value in pairs:
            if value is not None:
                body[key] = value
        if env is not None:
            body["env"] = dict(env)
        return await self._object("POST", "jobs", body)

    async def jobs(self, state: str | None = None, user: str | None = None) -> list[dict[str, Any]]:
        """Jobs, newest first: the token's own user's (an admin's: everybody's, or ``user``'s)."""
        answer = await self.request("GET", "jobs", params={"state": state, "user": user})
        return list((answer or {}).get("jobs") or [])

    async def job(self, job_id: str) -> dict[str, Any]:
        """One job."""
        return await self._object("GET", _path("jobs", job_id))

    async def cancel_job(self, job_id: str) -> dict[str, Any]:
        """Cancel a job: at once if it has not started, else its runner stops it."""
        return await self._object("DELETE", _path("jobs", job_id))

    async def job_logs(self, job_id: str, offset: int = 0) -> dict[str, Any]:
        """The job's output from ``offset``: ``{offset, data, next, complete}``."""
        return await self._object("GET", _path("jobs", job_id, "logs"), params={"offset": offset})

    async def node_jobs(self, node: str) -> list[dict[str, Any]]:
        """The jobs the runner on ``node`` should start, cancel or preempt."""
        answer = await self.request("GET", _path("nodes", node, "jobs"))
        return list((answer or {}).get("jobs") or [])

    async def job_status(
        self, job_id: str, state: str, exit_code: int | None = None, pid: int | None = None
    ) -> dict[str, Any]:
        """The runner's report: ``running`` (every round: its heartbeat) or ``exited``."""
        body: dict[str, Any] = {"state": state}
        if exit_code is not None:
            body["exit_code"] = exit_code
        if pid is not None:
            body["pid"] = pid
        return await self._object("POST", _path("jobs", job_id, "status"), body)

    async def job_log_append(self, job_id: str, offset: int, data: str) -> dict[str, Any]:
        """Upload the job's output from ``offset``; answers ``{next}``."""
        body = {"offset": offset, "data": data}
        return await self._object("POST", _path("jobs", job_id, "logs"), body)

    # -- GPU kernels: the kernel provisioner in the user's server -----------------------------

    async def request_kernel(
        self, offer: str, kernel_id: str, *, user: str | None = None
    ) -> dict[str, Any]:
        """Ask for ``offer`` for the kernel ``kernel_id``: its lease, granted or queued (the
        same kernel and offer again: the lease it has)."""
        body: dict[str, Any] = {"offer": offer, "kernel_id": kernel_id}
        if user is not None:
            body["user"] = user
        return await self._object("POST", "kernels", body)

    async def kernels(self, user: str | None = None) -> list[dict[str, Any]]:
        """Kernel leases not released yet: the token's own user's (an admin's: ``user``'s)."""
        answer = await self.request("GET", "kernels", params={"user": user})
        return list((answer or {}).get("kernels") or [])

    async def kernel(self, kernel_id: str) -> dict[str, Any]:
        """The kernel's newest lease."""
        return await self._object("GET", _path("kernels", kernel_id))

    async def release_kernel(self, kernel_id: str) -> dict[str, Any]:
        """End the kernel's lease (it was shut down, or restarts with another offer)."""
        return await self._object("DELETE", _path("kernels", kernel_id))

    async def kernel_activity(self, kernel_id: str, state: str) -> dict[str, Any]:
        """The provisioner's heartbeat: ``busy``, ``idle`` or ``starting``; answers the lease."""
        body = {"state": state}
        return await self._object("POST", _path("kernels", kernel_id, "activity"), body)
