"""Where the reclaimer reads a server, and what the user's lab says of the user.

Two facts the reclaim rounds need that no observation through the proxy can give:

* the server's own address (``server_url``), set by the hub-side spawner once the server
  runs: the reclaimer reads kernels there, because the proxy stamps every request it passes
  as the user's activity (the hub's ``last_activity``, which the idle culler reads too);
* the user's input as the server's jupyterlab-gpupool reports it (``presence_source`` =
  ``lab``, ``last_input``): from the first report on, a round's presence is that input alone
  (``pool.idlesignal.lab_presence``), so neither an open, untouched tab nor the reclaimer's
  reads can keep a GPU.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from .. import orm
from ..pool.idlesignal import MAX_REPORTED_IDLE, reported_input
from ..pool.leases import LIVE_STATES
from .errors import StoreError
from .leases import LeaseStore
from .read.presence import PresenceView, ServerUrlView, presence_view, server_url_view
from .rows import epoch, from_epoch

#: The longest server address kept (the column's size).
MAX_SERVER_URL = 2048


def check_server_url(url: str) -> str:
    """An ``http(s)://host[:port]/path/`` address, normalised to end in ``/``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StoreError(
            "invalid_field", "url must be an http:// or https:// address with a host", field="url"
        )
    if len(url) > MAX_SERVER_URL or parts.query or parts.fragment:
        raise StoreError(
            "invalid_field",
            f"url must be at most {MAX_SERVER_URL} characters, without a query or fragment",
            field="url",
        )
    return url if url.endswith("/") else url + "/"


class PresenceStore(LeaseStore):
    """The server's address and the lab's presence reports, one write each."""

    def _live_row(self, db: Any, lease_id: str) -> orm.LeaseRow:
        row = self.lease_row(db, lease_id)
        if row.state not in LIVE_STATES:
            raise StoreError("not_live", f"lease {lease_id} is {row.state}", field="id")
        return row

    def set_server_url(self, lease_id: str, url: str, *, actor: str = "") -> ServerUrlView:
        """The spawner's word on where the lease's server listens (audited: the reclaimer sends
        its token there, so only the spawner may say it)."""
        url = check_server_url(url)
        with self.transaction() as (db, _):
            row = self._live_row(db, lease_id)
            if row.server_url != url:
                row.server_url = url
                self._event(db, "server-address", actor or "system", row, {"url": url})
            return server_url_view(row)

    def report_presence(
        self, lease_id: str, idle_for: float | None, *, actor: str = ""
    ) -> PresenceView:
        """The lab's report: the user's last input was ``idle_for`` seconds ago (None: the lab
        runs and will report input; nothing yet). Not audited: a lab may report once a minute.
        """
        if idle_for is not None and not 0 <= idle_for <= MAX_REPORTED_IDLE:
            raise StoreError(
                "invalid_field",
                f"idle_for must be between 0 and {MAX_REPORTED_IDLE:g} seconds, or null",
                field="idle_for",
            )
        with self.transaction() as (db, _):
            row = self._live_row(db, lease_id)
            row.presence_source = "lab"
            if idle_for is not None:
                previous = epoch(row.last_input) if row.last_input is not None else None
                row.last_input = from_epoch(reported_input(previous, self._now_s(), idle_for))
            return presence_view(row)
