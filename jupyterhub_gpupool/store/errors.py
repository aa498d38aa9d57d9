"""The store's refusals: domain errors with a code, never an HTTP status.

A refusal is raised before the call wrote anything, so a batch of calls can answer it alone
and commit the others (group commit). The HTTP status of each code lives at the HTTP boundary.
"""

from __future__ import annotations

from ..pool.errors import Refusal


class StoreError(Refusal):
    """A request the store refuses (``code``, ``message``, ``field``, ``allowed``)."""

    @classmethod
    def of(cls, refusal: Refusal) -> StoreError:
        """The pool's refusal as the store's, its message as it is: it already names the field
        and the allowed values, which ``__init__`` would add a second time."""
        error = cls.__new__(cls)
        Exception.__init__(error, refusal.message)
        error.code, error.message = refusal.code, refusal.message
        error.field, error.allowed = refusal.field, refusal.allowed
        return error


def lease_not_found(lease_id: str, field: str = "id") -> StoreError:
    """The refusal for a lease that does not exist, and for one the caller may not see:
    identical, so that the answer does not reveal another user's lease exists."""
    return StoreError("not_found", f"no lease {lease_id!r}", field=field)
