"""Sphinx configuration: MyST Markdown, the pydata theme, warnings are errors in CI."""

import sys
from pathlib import Path

from jupyterhub_gpupool import __version__

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "jupyterhub-gpupool"
author = "jupyterhub-gpupool contributors"
copyright = "2026, jupyterhub-gpupool contributors"
version = release = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "traitsdoc",
    "openapi_md",
    "codes_md",
]
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
html_theme = "pydata_sphinx_theme"
html_static_path = ["_static"]
html_title = "jupyterhub-gpupool"
autodoc_typehints = "description"
