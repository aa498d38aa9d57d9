"""Optional dependencies, loaded only where they are used.

A plain ``pip install jupyterhub-gpupool`` runs the service on SQLite, the spawners and the
reclaimer. PostgreSQL's driver (extra ``postgres``), NVML (``nvml``) and the trace replays'
numpy (``simulate``) are extras: code that needs one asks :func:`require` for it where it
runs, so a missing extra is one line naming the ``pip install`` that brings it, never an
``ImportError`` at start-up of a part that does not use it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: The extra (``pyproject.toml``) that brings each optional top-level module.
EXTRAS = {
    "psycopg": "postgres",
    "numpy": "simulate",
    "jupyter_core": "kernels",
    "jupyter_client": "kernels",
}


class MissingExtra(RuntimeError):
    """An optional dependency is not installed; the message says which extra brings it."""


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` (a top-level name in :data:`EXTRAS`) or raise :class:`MissingExtra`.

    ``purpose`` completes the sentence "<purpose> needs ..." (e.g. "a PostgreSQL database URL").
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        extra = EXTRAS[module.partition(".")[0]]
        raise MissingExtra(
            f"{purpose} needs the {module.partition('.')[0]} package: "
            f"pip install 'jupyterhub-gpupool[{extra}]' ({e})"
        ) from None
