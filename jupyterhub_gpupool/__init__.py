"""jupyterhub-gpupool: one GPU pool for JupyterHub (whole GPUs, MIG slices and shares)."""

from ._version import __version__

__all__ = ["__version__"]
