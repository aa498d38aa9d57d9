"""The server extension's routes under ``<base_url>gpupool/``.

=====================================  ===========================================================
``GET  gpupool/state``                 the shared state (refreshed if older than the interval)
``GET  gpupool/events?client=<id>``    server-sent events: ``state`` on every refresh, ``save``
                                       when something asks the labs to save, ``saved`` after
``POST gpupool/save-all``              save every open document (the reclaimer; a lab's button)
``POST gpupool/save-all/<id>``         a lab's answer to a ``save`` event
``POST gpupool/keepalive``             Keep my GPU: extend the reclaim notice
``POST gpupool/resize {offer}``        save all, reserve ``offer`` (or ask for a GPU from a CPU-only
                                       server), and have the pool restart the server into it
``DELETE gpupool/resize``              give the reserved or queued target back
``POST gpupool/refresh``               ask the pool now (offers too), at most once per interval
``POST gpupool/presence {idle_for}``   the user's input in a visible tab, ``idle_for`` seconds
                                       ago: relayed to the pool at most once a minute
``GET  gpupool/jobs``                  the user's jobs (the pool's ``GET jobs``)
``DELETE gpupool/jobs/<id>``           cancel one of them
``GET  gpupool/jobs/<id>/logs?offset`` its output from ``offset`` (``{data, next, complete}``)
``GET  gpupool/kernels``               the user's GPU kernel leases (the pool's ``GET kernels``)
=====================================  ===========================================================

The event stream also carries ``kernel-starts`` (at once, then on every change): this server's
GPU kernel starts waiting for their GPU and the pool's idle notices to its GPU kernels, as the
kernels extension serves them at ``gpupool/kernel-starts`` (``jupyterhub_gpupool.kernels``).

Every route needs the server's own authentication (the hub's ``access:servers`` for this
server: the user's browser, or the reclaimer's token). Errors are JSON
``{"error": {"code", "message"}}``; a refusal of the pool keeps the pool's code and status.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.iostream import StreamClosedError

from jupyterhub_gpupool.kernels.board import BOARD

from .fanout import Fanout
from .pool import LabPoolClient, PoolDown, PoolError, PoolRefused
from .presence import MAX_IDLE_FOR, PresenceRelay
from .saving import SaveAll

#: A lab's client id (a UUID the frontend makes) and a save request's id.
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: A job's id as a route takes it (the pool's ids are hex; anything else is a 404 here).
_JOB_ID = r"[A-Za-z0-9_-]{1,64}"
#: A ``ping`` event is sent when nothing else was for this long: proxies keep the stream, and
#: a lab that hears nothing for 25 s knows the server is gone (a proxy may keep a stream open
#: after the server behind it died).
KEEPALIVE = 10.0


class _Base(APIHandler):
    """JSON in, JSON out; the fan-out and save-all from the app's settings."""

    auth_resource = "gpupool"

    @property
    def fanout(self) -> Fanout:
        fanout: Fanout = self.settings["gpupool_fanout"]
        return fanout

    @property
    def saver(self) -> SaveAll:
        saver: SaveAll = self.settings["gpupool_saver"]
        return saver

    def fail(self, status: int, code: str, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": {"code": code, "message": message}}))

    def fail_pool(self, e: PoolError) -> None:
        if isinstance(e, PoolRefused):
            self.fail(e.status or 400, e.code or "refused", e.message)
        else:
            self.fail(503, "pool_unavailable", e.message)

    def body(self) -> dict[str, Any]:
        try:
            data = json.loads(self.request.body or b"{}")
        except ValueError:
            raise web.HTTPError(400, "the body is not JSON") from None
        if not isinstance(data, dict):
            raise web.HTTPError(400, "the body must be a JSON object")
        return data

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": {"code": _code(status_code), "message": message}}))


class _Quiet(_Base):
    """Routes a lab calls on its own (polling, answers): they are not the user's activity, so
    an idle lab does not keep the server looking busy to the hub's culler or the reclaimer."""

    def update_api_activity(self) -> None:
        return


def _code(status: int) -> str:
    return {400: "bad_request", 403: "forbidden", 404: "not_found", 405: "not_allowed"}.get(
        status, "error"
    )


class StateHandler(_Quiet):
    @web.authenticated
    async def get(self) -> None:
        self.finish(await self.fanout.current())


class RefreshHandler(_Quiet):
    @web.authenticated
    async def post(self) -> None:
        fanout = self.fanout
        if fanout.clock() - (fanout.state["pool"].get("fetched_at") or -1e18) < fanout.interval:
            self.finish(fanout.state)  # asked within the interval: the answer is that one
            return
        self.finish(await fanout.refresh(offers=True))


class EventsHandler(_Quiet):
    """Server-sent events for one lab; ``client`` names it for save answers."""

    @web.authenticated
    async def get(self) -> None:
        client = self.get_argument("client", "")
        if not _ID.match(client):
            self.fail(400, "invalid_argument", "client must be 1-64 letters, digits, - or _")
            return
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Accel-Buffering", "no")  # nginx: do not buffer the stream
        fanout = self.fanout
        queue = fanout.subscribe(client)
        queue.put_nowait(("kernel-starts", BOARD.snapshot()))
        self._closed = asyncio.Event()
        try:
            self.write(f"retry: {int(fanout.interval * 1000)}\n\n")
            await self.flush()
            while not self._closed.is_set():
                try:
                    event, data = await asyncio.wait_for(queue.get(), KEEPALIVE)
                    self.write(f"event: {event}\ndata: {json.dumps(data)}\n\n")
                except asyncio.TimeoutError:
                    self.write("event: ping\ndata: {}\n\n")
                await self.flush()
        except StreamClosedError:
            pass
        finally:
            fanout.unsubscribe(client)

    def on_connection_close(self) -> None:
        if hasattr(self, "_closed"):
            self._closed.set()
            self.fanout.unsubscribe(self.get_argument("client", ""))


class SaveAllHandler(_Base):
    """``POST gpupool/save-all``: ``{"saved": [paths], "via": "lab"|"checkpoints", ...}``."""

    @web.authenticated
    async def post(self) -> None:
        body = self.body()
        self.finish(await self.saver.run(str(body.get("reason") or "")[:255]))


class SaveAnswerHandler(_Quiet):
    @web.authenticated
    async def post(self, request_id: str) -> None:
        client = self.get_argument("client", "")
        body = self.body()
        for key in ("saved", "unchanged", "failed"):
            if not isinstance(body.get(key, []), list):
                self.fail(400, "invalid_field", f"{key} must be a list")
                return
        if not self.saver.answer(request_id, client, body):
            self.fail(404, "not_found", f"nobody waits for save {request_id} from {client!r}")
            return
        self.finish({"accepted": True})


class KeepaliveHandler(_Base):
    @web.authenticated
    async def post(self) -> None:
        fanout = self.fanout
        state = await fanout.current()
        lease = state.get("lease")
        if fanout.client is None or lease is None:
            self.fail(409, "no_lease", "this server holds no GPU lease to keep")
            return
        try:
            await fanout.client.keepalive(lease["id"])
        except PoolError as e:
            self.fail_pool(e)
            return
        self.finish(await fanout.refresh())


class ResizeHandler(_Base):
    """Move to another offer (or from CPU-only to a GPU); the pool restarts the server."""

    @web.authenticated
    async def post(self) -> None:
        offer = self.body().get("offer")
        if not isinstance(offer, str) or not offer:
            self.fail(400, "missing_field", "offer is required")
            return
        fanout = self.fanout
        if fanout.client is None:
            self.fail(503, "pool_unavailable", fanout.why_no_pool)
            return
        state = await fanout.current()
        if not state["pool"]["ok"]:
            self.fail(503, "pool_unavailable", state["pool"]["error"] or "the pool is away")
            return
        if state.get("pending"):
            self.fail(409, "resize_pending", "a move is already waiting; cancel it first")
            return
        saved = await self.saver.run(f"moving to {offer}")
        lease = state.get("lease")
        try:
            if lease is not None:
                target = await fanout.client.resize(lease["id"], offer)
            else:
                target = await fanout.client.allocate(fanout.server, offer)
            try:
                restart = await fanout.client.restart(target["id"])
            except PoolError:
                await _give_back(fanout, target["id"])
                raise
        except PoolError as e:
            self.fail_pool(e)
            return
        await fanout.refresh()
        self.set_status(202)
        self.finish({"target": target, "restart": restart, "saved": saved})

    @web.authenticated
    async def delete(self) -> None:
        fanout = self.fanout
        state = await fanout.current()
        pending = state.get("pending")
        if fanout.client is None or not pending:
            self.fail(404, "not_found", "no move is waiting")
            return
        try:
            await fanout.client.cancel(pending["id"])
        except PoolError as e:
            self.fail_pool(e)
            return
        self.finish(await fanout.refresh())


class PresenceHandler(_Base):
    """A lab saw the user's input (keyboard, pointer) in a visible tab. It counts as this
    server's activity too (not ``_Quiet``): it is the user's."""

    @web.authenticated
    async def post(self) -> None:
        idle_for = self.body().get("idle_for")
        if (
            isinstance(idle_for, bool)
            or not isinstance(idle_for, (int, float))
            or not 0 <= idle_for <= MAX_IDLE_FOR
        ):
            self.fail(400, "invalid_field", f"idle_for must be a number from 0 to {MAX_IDLE_FOR:g}")
            return
        relay: PresenceRelay = self.settings["gpupool_presence"]
        if not relay.enabled:
            self.finish({"reported": False, "in": None})
            return
        self.set_status(202)
        self.finish({"reported": True, "in": relay.report(float(idle_for))})


class _JobsBase(_Base):
    """The user's jobs, asked of the pool with the server's token (the pool answers only the
    token's user's jobs: another's is a 404, as a missing one)."""

    def pool(self) -> LabPoolClient | None:
        fanout = self.fanout
        if fanout.client is None:
            self.fail(503, "pool_unavailable", fanout.why_no_pool)
        return fanout.client

    async def answer_list(
        self, key: str, fetch: Callable[[LabPoolClient], Awaitable[list[dict[str, Any]]]]
    ) -> None:
        """``{key: [...]}`` from the pool, or the pool's error."""
        client = self.pool()
        if client is None:
            return
        try:
            items = await fetch(client)
        except PoolError as e:
            self.fail_pool(e)
            return
        self.finish({key: items})


class JobsHandler(_JobsBase, _Quiet):
    """``GET gpupool/jobs``: ``{"jobs": [...]}``, newest first (the panel polls it: quiet)."""

    @web.authenticated
    async def get(self) -> None:
        await self.answer_list("jobs", lambda client: client.jobs())


class JobHandler(_JobsBase):
    """``DELETE gpupool/jobs/<id>``: cancel the job (the user's action: it counts as activity)."""

    @web.authenticated
    async def delete(self, job_id: str) -> None:
        client = self.pool()
        if client is None:
            return
        try:
            self.finish(await client.cancel_job(job_id))
        except PoolError as e:
            self.fail_pool(e)


class JobLogsHandler(_JobsBase, _Quiet):
    """``GET gpupool/jobs/<id>/logs?offset=N``: the job's output from ``offset``."""

    @web.authenticated
    async def get(self, job_id: str) -> None:
        raw = self.get_argument("offset", "0")
        if not raw.isdigit():
            self.fail(400, "invalid_argument", "offset must be a whole number ≥ 0")
            return
        client = self.pool()
        if client is None:
            return
        try:
            self.finish(await client.job_logs(job_id, int(raw)))
        except PoolError as e:
            self.fail_pool(e)


class KernelsHandler(_JobsBase, _Quiet):
    """``GET gpupool/kernels``: ``{"kernels": [...]}``, the user's GPU kernel leases not ended
    (queued ones with their position), oldest first (the panel polls it: quiet)."""

    @web.authenticated
    async def get(self) -> None:
        await self.answer_list("kernels", lambda client: client.kernels())


async def _give_back(fanout: Fanout, lease_id: str) -> None:
    assert fanout.client is not None
    try:
        await fanout.client.cancel(lease_id)
    except (PoolDown, PoolRefused):
        fanout.log.warning("Could not give back lease %s after a failed move", lease_id)


def handlers(base_url: str) -> list[tuple[str, type]]:
    def at(path: str) -> str:
        return url_path_join(base_url, "gpupool", path)

    return [
        (at("state"), StateHandler),
        (at("refresh"), RefreshHandler),
        (at("events"), EventsHandler),
        (at("save-all"), SaveAllHandler),
        (at(r"save-all/([A-Za-z0-9_-]{1,64})"), SaveAnswerHandler),
        (at("keepalive"), KeepaliveHandler),
        (at("resize"), ResizeHandler),
        (at("presence"), PresenceHandler),
        (at("jobs"), JobsHandler),
        (at(rf"jobs/({_JOB_ID})"), JobHandler),
        (at(rf"jobs/({_JOB_ID})/logs"), JobLogsHandler),
        (at("kernels"), KernelsHandler),
    ]
