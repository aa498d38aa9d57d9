"""jupyterlab-gpupool: your GPU from the JupyterHub GPU pool inside JupyterLab.

The frontend (status bar item, side panel) is prebuilt into ``labextension/``; the server
extension (:mod:`.extension`) talks to the pool with the server's own token and shares one
answer between every open tab; :class:`GPUPoolWidget` and :func:`status` show the same inside a
notebook or a script.
"""

from __future__ import annotations

from typing import Any

try:
    from ._version import __version__
except ImportError:  # a source checkout that was never built
    __version__ = "0.0.0.dev0"

from .client import status

__all__ = ["GPUPoolWidget", "__version__", "status"]


def __getattr__(name: str) -> Any:
    if name == "GPUPoolWidget":  # ipywidgets only when asked for
        from .widget import GPUPoolWidget

        return GPUPoolWidget
    raise AttributeError(name)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyterlab-gpupool"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyterlab_gpupool"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    from .extension import load

    load(server_app)
