"""Data shipped with the package (MIG profile catalog, demo pools)."""

from importlib import resources
from pathlib import Path


def data_path(name: str) -> Path:
    """Path of a shipped data file; works from a wheel and from a source checkout."""
    return Path(str(resources.files(__name__).joinpath(name)))
