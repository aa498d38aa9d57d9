"""The exception tree of the pool core.

Every error names the offending ``field`` and, where there is a closed set, the ``allowed``
values, so the service can turn it into a 4xx JSON body and the CLI into one clear line.
"""

from __future__ import annotations

from collections.abc import Iterable


class PoolError(Exception):
    """Base class: ``code`` is machine-readable (snake_case), ``str(err)`` is for humans."""

    code = "pool_error"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        allowed: Iterable[object] | None = None,
        code: str | None = None,
    ) -> None:
        self.field = field
        self.allowed = list(allowed) if allowed is not None else None
        if code is not None:
            self.code = code
        text = message
        if field and not message.startswith(field):
            text = f"{field}: {message}"
        if self.allowed is not None:
            text += f" (allowed: {', '.join(map(str, self.allowed)) or 'none'})"
        super().__init__(text)
        self.message = text

    def to_dict(self) -> dict[str, dict[str, object]]:
        """The JSON error body ``{"error": {"code", "message"}}`` (plus ``field``/``allowed``
        when known)."""
        body: dict[str, object] = {"code": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        if self.allowed is not None:
            body["allowed"] = self.allowed
        return {"error": body}


class ConfigError(PoolError):
    """Invalid admin configuration: offers, quotas, inventory."""

    code = "invalid_config"


class UnknownModel(ConfigError):
    """A GPU model name the catalog does not know."""

    code = "unknown_gpu_model"


class UnknownProfile(ConfigError):
    """A MIG profile that does not exist for that GPU model."""

    code = "unknown_mig_profile"


class MigLayoutError(PoolError):
    """A set of MIG instances NVIDIA's rules do not allow on one GPU."""

    code = "invalid_mig_layout"


class RequestError(PoolError):
    """A request that can never be satisfied as asked (not merely "not now")."""

    code = "invalid_request"


class Refusal(PoolError):
    """A request the pool refuses: the code comes first, and no transport status goes with it.

    The service maps the code to an HTTP status in one table (``service/apihandlers/errors``),
    so persistence and domain code never decide how the web answers. Refusals pickle by state:
    the store process sends them back to the service.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        field: str | None = None,
        allowed: Iterable[object] | None = None,
    ) -> None:
        super().__init__(message, field=field, allowed=allowed, code=code)

    def __reduce__(self) -> tuple[object, ...]:
        """``message`` already holds the field and allowed values ``__init__`` would add."""
        return _restore, (type(self), self.code, self.message, self.field, self.allowed)


def _restore(
    cls: type[Refusal], code: str, message: str, field: str | None, allowed: list[object] | None
) -> Refusal:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.code, error.message, error.field, error.allowed = code, message, field, allowed
    return error
