"""The pool's one API client: its split of failures, its transport, and what importing it costs.

The failures are driven through the client's transport seam (the node agent's tests use the
same one); the default transport runs against a real tornado server on a local port.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from jupyterhub_gpupool.poolclient import (
    PoolClient,
    PoolClientError,
    PoolRefused,
    PoolUnavailable,
    TornadoTransport,
)

API = "http://pool.example/services/gpupool/api/v1"
TOKEN = "s3cr3t-t0ken-value"


def answering(status: int, body: bytes | str):
    async def transport(method, url, headers, data):
        return status, body.encode() if isinstance(body, str) else body

    return transport


def refused_connection():
    async def transport(method, url, headers, data):
        raise ConnectionRefusedError(111, "Connection refused")

    return transport


def call(transport) -> object:
    client = PoolClient(API, TOKEN, transport=transport)
    return asyncio.run(client.lease("L1"))


def failure(transport) -> PoolClientError:
    with pytest.raises(PoolClientError) as info:
        call(transport)
    return info.value


def test_no_answer_is_unavailable_and_says_could_not_be_reached():
    e = failure(refused_connection())
    assert type(e) is PoolUnavailable and e.status == 0 and e.code == ""
    assert "could not be reached" in e.message and "Connection refused" in e.message


@pytest.mark.parametrize("status", [502, 503, 504])
def test_a_gateway_or_busy_answer_is_unavailable(status):
    e = failure(answering(status, "<html>Bad Gateway</html>"))
    assert type(e) is PoolUnavailable and e.status == status
    assert e.message == f"the GPU pool is not answering (HTTP {status})"
    pool_503 = {"error": {"code": "store_unavailable", "message": "the database is away"}}
    e = failure(answering(503, json.dumps(pool_503)))
    assert (e.code, e.message) == ("store_unavailable", "the database is away")


def test_a_pool_error_is_a_refusal_with_its_code_field_and_allowed():
    body = {
        "error": {
            "code": "unknown_offer",
            "message": "no offer 'x'",
            "field": "offer",
            "allowed": ["h100", "a100-1g"],
        }
    }
    e = failure(answering(422, json.dumps(body)))
    assert type(e) is PoolRefused and e.status == 422
    assert (e.code, e.message, e.field, e.allowed) == (
        "unknown_offer",
        "no offer 'x'",
        "offer",
        ["h100", "a100-1g"],
    )


def test_jupyterhubs_own_refusal_keeps_its_message():
    """A token the hub rejects is answered by JupyterHub's auth, as {"status", "message"}."""
    e = failure(answering(403, json.dumps({"status": 403, "message": "Action is not authorized"})))
    assert type(e) is PoolRefused and e.message == "Action is not authorized" and e.code == ""


def test_a_500_and_a_redirect_are_refusals_and_text_is_not_the_pool():
    e = failure(answering(500, "Internal Server Error"))
    assert type(e) is PoolRefused and e.message.startswith("the GPU pool answered HTTP 500")
    e = failure(answering(302, ""))
    assert type(e) is PoolRefused and "redirect" in e.message
    e = failure(answering(200, "<html>Sign in</html>"))
    assert type(e) is PoolUnavailable and "not JSON" in e.message


def test_a_token_never_reaches_the_message():
    e = failure(answering(400, f"bad request for ?token={TOKEN}"))
    assert TOKEN not in e.message and TOKEN not in str(e)


def test_answers_decode_and_requests_are_counted():
    client = PoolClient(API + "/", TOKEN, transport=answering(200, '{"id": "L1"}'))
    assert asyncio.run(client.lease("L1")) == {"id": "L1"}
    client.transport = answering(200, b"")
    assert asyncio.run(client.keepalive("L1")) is None
    assert client.requests == 2 and client.api_url == API + "/"


class _Redirect(web.RequestHandler):
    def get(self, *_):
        self.redirect("/elsewhere/")


class _Elsewhere(web.RequestHandler):
    seen: list[str | None] = []

    def get(self):
        _Elsewhere.seen.append(self.request.headers.get("Authorization"))
        self.write({"leaked": True})


class _Lease(web.RequestHandler):
    def get(self, lease_id):
        self.write({"id": lease_id, "auth": self.request.headers.get("Authorization")})


def test_the_default_transport_talks_http_and_never_follows_a_redirect():
    async def scenario():
        sock, port = bind_unused_port()
        app = web.Application(
            [
                (r"/api/allocations/(L[^/]*)", _Lease),
                (r"/api/allocations/(R[^/]*)", _Redirect),
                (r"/elsewhere/", _Elsewhere),
            ]
        )
        server = HTTPServer(app)
        server.add_sockets([sock])
        try:
            client = PoolClient(f"http://127.0.0.1:{port}/api/", TOKEN, timeout=5)
            assert isinstance(client.transport, TornadoTransport)
            assert await client.lease("L1") == {"id": "L1", "auth": f"token {TOKEN}"}
            with pytest.raises(PoolRefused, match="redirect"):
                await client.lease("R1")
            server.stop()
            with pytest.raises(PoolUnavailable, match="could not be reached"):
                await client.lease("L1")
        finally:
            server.stop()

    asyncio.run(scenario())
    assert _Elsewhere.seen == []  # the token went nowhere else


def test_importing_the_client_and_the_time_parser_loads_nothing_heavy():
    """The lab package imports them in every user's server: no SQLAlchemy, alembic, numpy."""
    code = textwrap.dedent(
        """
        import json, sys
        import jupyterhub_gpupool.poolclient, jupyterhub_gpupool.timeparse
        try:
            import jupyterlab_gpupool.pool  # the lab's side of it, where installed
        except ImportError:
            pass
        print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "jupyterhub_gpupool" in loaded
    heavy = loaded & {"sqlalchemy", "alembic", "numpy", "scipy", "yaml", "prometheus_client"}
    assert not heavy, f"importing the API client loads {sorted(heavy)}"
