"""The pool service's HTML pages, behind hub OAuth: the user page at the prefix root and the
admin panel under ``admin/``; their script, styles and chart library under ``static/``."""

from __future__ import annotations

from typing import Any

from tornado import web

from . import admin, approvals, ended, governance, user
from .base import STATIC, StaticHandler

#: A route: its pattern, its handler and (optionally) the handler's keyword arguments.
Route = tuple[str, type[web.RequestHandler]] | tuple[str, type[web.RequestHandler], dict[str, Any]]


def default_handlers(prefix: str) -> list[Route]:
    """The pages under the service ``prefix`` (``/services/gpupool/``), with or without its
    trailing slash: the hub's Services menu links to the prefix itself."""
    root = prefix.rstrip("/")
    return [
        (root + "/?", user.UserPageHandler),
        (root + "/keep/([^/]+)", user.KeepHandler),
        (root + "/ended/([^/]+)", ended.LeaseEndPage),
        (root + "/admin/?", admin.MapPage),
        (root + "/admin/leases", admin.LeasesPage),
        (root + "/admin/nodes", admin.NodesPage),
        (root + "/admin/quotas", admin.QuotasPage),
        (root + "/admin/audit", admin.AuditPage),
        (root + "/admin/approvals", approvals.ApprovalsPage),
        (root + "/admin/usage", governance.UsagePage),
        (root + "/admin/capacity", governance.CapacityPage),
        (root + "/admin/what-if", governance.WhatIfPage),
        (root + "/static/(.*)", StaticHandler, {"path": STATIC}),
    ]
