"""The load benchmark's minimal HTTP client (``benchmarks/loadclient.py``) reads what a real
tornado server answers as ``http.client`` does: bodies by length and chunked, empty ones,
several answers over one connection, and says so when the server closes it."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import tornado.httpserver
import tornado.netutil
import tornado.web

_SPEC = importlib.util.spec_from_file_location(
    "loadclient", Path(__file__).resolve().parents[2] / "benchmarks" / "loadclient.py"
)
assert _SPEC is not None and _SPEC.loader is not None
loadclient = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(loadclient)

LEASE = {"id": "abc", "state": "granted", "note": "é" * 200_000}  # more than one recv reads


class Whole(tornado.web.RequestHandler):
    def post(self) -> None:
        self.set_status(201)
        self.write({**LEASE, "echo": json.loads(self.request.body)})


class Chunked(tornado.web.RequestHandler):
    async def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        text = json.dumps(LEASE)
        self.write(text[:100])
        await self.flush()  # no length known: the rest goes chunked
        self.write(text[100:])


class Empty(tornado.web.RequestHandler):
    def delete(self) -> None:
        self.set_status(204)


class Closing(tornado.web.RequestHandler):
    def get(self) -> None:
        self.set_header("Connection", "close")
        self.write({"bye": True})


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")  # bound here: no port race
    port = sockets[0].getsockname()[1]
    started = threading.Event()
    loop = asyncio.new_event_loop()

    def run() -> None:
        asyncio.set_event_loop(loop)
        app = tornado.web.Application(
            [("/whole", Whole), ("/chunked", Chunked), ("/empty", Empty), ("/close", Closing)]
        )
        tornado.httpserver.HTTPServer(app).add_sockets(sockets)
        loop.call_soon(started.set)
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(30)
    yield port
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)


@pytest.mark.parametrize("kind", ["raw", "stdlib"])
def test_both_clients_read_the_same_answers(server: int, kind: str) -> None:
    conn = loadclient.CLIENTS[kind]("127.0.0.1", server, {"Authorization": "token x"}, 30.0)
    for _ in range(3):  # one keep-alive connection throughout
        status, body = conn.call("POST", "/whole", json.dumps({"n": 1}).encode())
        assert (status, body) == (201, {**LEASE, "echo": {"n": 1}})
        assert conn.call("GET", "/chunked", None) == (200, LEASE)
        assert conn.call("DELETE", "/empty", None) == (204, None)


def test_the_raw_client_says_when_the_server_closes(server: int) -> None:
    conn = loadclient.RawConnection("127.0.0.1", server, {}, 30.0)
    with pytest.raises(loadclient.ProtocolError, match="closed"):
        conn.call("GET", "/close", None)
