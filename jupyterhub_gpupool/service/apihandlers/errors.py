"""The HTTP boundary of errors: one table from refusal codes to statuses, one JSON body.

The pool and the store raise ``PoolError``\\ s that carry a code, a message, the field at fault
and the allowed values, never a status; handlers raise ``APIError`` (the same family) for what
they check themselves. Here, and only here, a code becomes an HTTP status. Adding a refusal
code means declaring it in ``pool/codes.py`` and giving it a status below.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...pool.errors import PoolError

#: The HTTP status of every declared refusal code.
STATUS: dict[str, int] = {
    # 400: the request is malformed
    "invalid_json": 400,
    "too_deep": 400,
    "invalid_argument": 400,
    "invalid_state": 400,
    "invalid_by": 400,
    "invalid_range": 400,
    "bad_request": 400,
    "invalid_command": 400,
    "invalid_env": 400,
    "invalid_image": 400,
    "invalid_replicas": 400,
    "unknown_class": 400,
    # 401/403: who is asking
    "unauthorized": 401,
    "forbidden": 403,
    "not_in_group": 403,
    "class_not_allowed": 403,
    # 404/405
    "not_found": 404,
    "method_not_allowed": 405,
    "body_too_large": 413,
    # 409: the current state is in the way
    "already_allocated": 409,
    "duplicate_request": 409,
    "not_live": 409,
    "not_ready": 409,
    "resize_pending": 409,
    "resize_target": 409,
    "extension_limit": 409,
    "not_extendable": 409,
    "reclaim_in_progress": 409,
    "not_leader": 409,
    "not_acting": 409,
    "no_notice": 409,
    "not_awaiting_approval": 409,
    "repartition_applying": 409,
    "gpu_elsewhere": 409,
    "device_held": 409,
    "repartition_pending": 409,
    "not_on_kubernetes": 409,
    "over_limit": 409,
    "conflict": 409,
    "job_not_running": 409,
    "job_lease": 409,
    "kernel_exists": 409,
    # 429: too much at once
    "too_many_requests": 429,
    # 422: well-formed, but the pool cannot act on it
    "unknown_field": 422,
    "missing_field": 422,
    "invalid_field": 422,
    "invalid_reason": 422,
    "invalid_request": 422,
    "unknown_offer": 422,
    "no_such_hardware": 422,
    "cluster_not_served": 422,
    "unknown_cluster": 422,
    "exceeds_node_size": 422,
    "unknown_device": 422,
    "device_mismatch": 422,
    # every refusal by a quota is 422 (the request is well formed; the quota does not allow it)
    "no_quota": 422,
    "budget_exhausted": 422,
    "exceeds_limit": 422,
    "exceeds_exception_ceiling": 422,
    "same_offer": 422,
    "unknown_server": 422,
    "invalid_config": 422,
    "unknown_gpu_model": 422,
    "unknown_mig_profile": 422,
    "invalid_mig_layout": 422,
    "pool_error": 422,
    "unprocessable": 422,
    # 5xx
    "internal_error": 500,
    "store_unavailable": 503,
    "hub_unavailable": 503,
    "store_restarting": 503,
    "unavailable": 503,
    "error": 500,
}

#: The code of a bare HTTP error (tornado's own, e.g. a 405) by its status.
GENERIC: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    422: "unprocessable",
    500: "internal_error",
    503: "unavailable",
}


class APIError(PoolError):
    """A refusal of the HTTP layer itself (malformed body, missing scope): the message is
    answered exactly as written (the pool's own errors prefix the field)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        field: str | None = None,
        allowed: Iterable[Any] | None = None,
    ) -> None:
        Exception.__init__(self, message)
        self.code, self.message, self.field = code, message, field
        self.allowed = list(allowed) if allowed is not None else None


def status_of(error: PoolError) -> int:
    """The HTTP status an error answers with (422 for a code no table row names)."""
    return STATUS.get(error.code, 422)
