"""The load benchmark's client processes: allocate + release in a loop over one keep-alive
HTTP/1.1 connection (``service_load.py`` starts them; stdlib only, so they start fast).

Two HTTP clients speak to the service, chosen with ``--client``:

- ``raw`` (the default): one socket, each request one prebuilt ``sendall``, the response read
  by its ``Content-Length`` (chunked bodies are decoded too), the body parsed as JSON — what a
  load generator such as ``wrk`` does. On the project's 2-core VM the clients share the cores
  with the service, its store process and PostgreSQL, so their own CPU is taken from what is
  measured;
- ``stdlib``: ``http.client``, which parses every response's headers with ``email.parser``:
  ~0.9 ms of client CPU per allocate + release pair there, most of what the raw client saves.

Both check every answer (status and lease state) and count what differs as an error.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

OFFER = "h100"
_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[ \t]*chunked", re.IGNORECASE)
_CLOSE = re.compile(rb"\r\nconnection:[ \t]*close", re.IGNORECASE)


class ProtocolError(Exception):
    """The service answered something this client cannot read (or closed the connection)."""


class RawConnection:
    """A minimal HTTP/1.1 keep-alive client for one host (requests go out one at a time)."""

    def __init__(self, host: str, port: int, headers: dict[str, str], timeout: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        fixed = {"Host": f"{host}:{port}", **headers}
        self.head = "".join(f"{k}: {v}\r\n" for k, v in fixed.items())
        self.buf = b""

    def _more(self) -> None:
        data = self.sock.recv(262144)
        if not data:
            raise ProtocolError("the service closed the connection")
        self.buf += data

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            self._more()
        out, self.buf = self.buf[:end], self.buf[end + 2 :]
        return out

    def call(self, method: str, path: str, body: bytes | None) -> tuple[int, Any]:
        """Send one request and read its response: (status, parsed JSON body or None)."""
        payload = body or b""
        request = f"{method} {path} HTTP/1.1\r\n{self.head}Content-Length: {len(payload)}\r\n\r\n"
        self.sock.sendall(request.encode() + payload)
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._more()
        head, self.buf = self.buf[: end + 2], self.buf[end + 4 :]
        if not head.startswith(b"HTTP/1.1 "):
            raise ProtocolError(f"not an HTTP/1.1 response: {head[:40]!r}")
        status = int(head[9:12])
        if (length := _LENGTH.search(head)) is not None:
            data = self._take(int(length.group(1)))
        elif _CHUNKED.search(head):
            parts = []
            while size := int(self._line().split(b";")[0], 16):
                parts.append(self._take(size))
                self._line()
            while self._line():  # trailers, then the empty line
                pass
            data = b"".join(parts)
        elif status in (204, 304):
            data = b""
        else:
            raise ProtocolError(f"a {status} response without a length")
        if _CLOSE.search(head):
            raise ProtocolError("the service closed the keep-alive connection")
        return status, json.loads(data) if data else None


class StdlibConnection:
    """The same calls through ``http.client``."""

    def __init__(self, host: str, port: int, headers: dict[str, str], timeout: float) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        self.headers = headers

    def call(self, method: str, path: str, body: bytes | None) -> tuple[int, Any]:
        """Send one request and read its response: (status, parsed JSON body or None)."""
        self.conn.request(method, path, body=body, headers=self.headers)
        r = self.conn.getresponse()
        return r.status, json.loads(r.read() or b"null")


CLIENTS = {"raw": RawConnection, "stdlib": StdlibConnection}


def client(
    wid: int,
    api: str,
    token: str,
    start_at: float,
    warmup: float,
    seconds: float | None,
    pairs: int | None,
    out: Any,
    kind: str = "raw",
) -> None:
    """Allocate + release in a loop over one keep-alive connection; report latencies and CPU."""
    u = urlsplit(api)
    prefix = u.path.rstrip("/")
    headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}
    conn = CLIENTS[kind](u.hostname or "127.0.0.1", u.port or 80, headers, 60.0)
    post_ms: list[float] = []
    delete_ms: list[float] = []
    pair_ms: list[float] = []
    errors: Counter[str] = Counter()
    first = last = None
    cpu0 = None
    measured = 0
    i = 0
    while time.time() < start_at:
        time.sleep(min(0.01, max(0.0, start_at - time.time())))
    window = start_at + warmup
    while True:
        now = time.time()
        if seconds is not None and now >= window + seconds:
            break
        if pairs is not None and measured >= pairs:
            break
        measuring = now >= window
        if measuring and cpu0 is None:
            cpu0 = time.process_time()
        body = json.dumps({"user": f"bench{wid}", "server": f"s{i}", "offer": OFFER}).encode()
        i += 1
        t0 = time.perf_counter()
        status, lease = conn.call("POST", f"{prefix}/allocations", body)
        t1 = time.perf_counter()
        if status != 201 or lease.get("state") != "granted":
            errors[f"POST {status} {lease.get('state') if isinstance(lease, dict) else ''}"] += 1
            if status != 201:
                continue
        status2, _ = conn.call("DELETE", f"{prefix}/allocations/{lease['id']}", None)
        t2 = time.perf_counter()
        if status2 != 200:
            errors[f"DELETE {status2}"] += 1
        if measuring:
            first = now if first is None else first
            last = time.time()
            measured += 1
            post_ms.append(1000 * (t1 - t0))
            delete_ms.append(1000 * (t2 - t1))
            pair_ms.append(1000 * (t2 - t0))
    out.put(
        {
            "wid": wid,
            "post_ms": post_ms,
            "delete_ms": delete_ms,
            "pair_ms": pair_ms,
            "errors": dict(errors),
            "first": first,
            "last": last,
            "cpu_s": time.process_time() - (cpu0 if cpu0 is not None else 0.0),
        }
    )
