"""Where a started server listens, for the pool's reclaimer."""

from __future__ import annotations

from typing import Any


def internal_url(started: Any, base_url: str, internal_ssl: bool) -> str | None:
    """The server's own address from what ``Spawner.start`` returned (``(ip, port)`` or a
    URL), with its base URL: where the reclaimer reads it without the proxy, which would stamp
    its reads as the user's activity. None with ``internal_ssl`` (the reclaimer holds no
    client certificate): it reads through the proxy then."""
    if internal_ssl:
        return None
    if isinstance(started, str):
        base = started.rstrip("/")
    elif isinstance(started, (tuple, list)) and len(started) == 2:
        ip, port = started
        host = f"[{ip}]" if ":" in str(ip) else (ip or "127.0.0.1")
        base = f"http://{host}:{port}"
    else:
        return None
    return base + (base_url if base_url.startswith("/") else "/" + base_url)
