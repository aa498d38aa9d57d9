"""The one reader of ISO 8601 times, for every part (the service, the store, the reclaimer,
the spawner, the lab package).

Times cross the API, the hub's API and the database as text: the pool writes ``…Z``, JupyterHub
and Jupyter Server write ``…Z`` or ``+00:00``, the databases' own text has no zone at all. All
mean UTC, so a time without a zone is read as UTC, and every answer is an aware UTC
``datetime``: callers take ``.timestamp()`` for epoch seconds or drop the zone for the store's
naive UTC. It imports only the standard library (``pool/`` and the lab package use it too).
"""

from __future__ import annotations

from datetime import datetime, timezone

_EARLIEST = datetime.min.replace(tzinfo=timezone.utc)
_LATEST = datetime.max.replace(tzinfo=timezone.utc)


def parse_time(value: str | datetime | None, *, lenient: bool = False) -> datetime | None:
    """``value`` as an aware UTC datetime; None for None or ``""``.

    Text that is not an ISO 8601 time raises ``ValueError``, or gives None when ``lenient``
    (a peer's timestamp that is only informative: a kernel's ``last_activity``). An offset
    that takes the time past year 1 or 9999 gives the first or last representable time.
    """
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        moment = value
    else:
        text = str(value)
        if text.endswith("Z"):  # Python 3.10 reads no "Z"
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            if lenient:
                return None
            raise ValueError(f"not an ISO 8601 time: {value!r}") from None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    try:
        return moment.astimezone(timezone.utc)
    except OverflowError:  # 0001-01-01T00:00+01:00, 9999-12-31T23:59-01:00
        return _EARLIEST if moment.year == 1 else _LATEST


def format_time(dt: datetime | None) -> str | None:
    """``dt`` as the pool writes times: ISO 8601 with a ``Z`` (None stays None). A naive time
    is UTC, as the database keeps it; formatted directly (a lease's JSON has up to seven)."""
    if dt is None:
        return None
    if dt.tzinfo is None:
        return dt.isoformat() + "Z"
    return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def epoch_moment(at: float | None) -> datetime | None:
    """Epoch seconds as an aware UTC datetime (None stays None): the moments ``pool/``'s
    answers carry, for the store and the service to keep or write as they do."""
    return None if at is None else datetime.fromtimestamp(at, timezone.utc)


def format_epoch(at: float | None) -> str | None:
    """Epoch seconds as the pool writes times (``format_time``; None stays None)."""
    return format_time(epoch_moment(at))
