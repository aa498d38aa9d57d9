"""``refusal-codes`` directive: the table of every refusal code, its HTTP status and meaning.

    ```{refusal-codes}
    ```

rendered at build time from the one declaration (``jupyterhub_gpupool.pool.codes``) and the one
status table (``jupyterhub_gpupool.service.apihandlers.errors``), so the page cannot drift.
"""

from __future__ import annotations

from docutils import nodes
from openapi_md import _inline, _table
from sphinx.util.docutils import SphinxDirective


class RefusalCodesDirective(SphinxDirective):
    """A table: code, status, meaning, ordered by status then code."""

    def run(self) -> list[nodes.Node]:
        from jupyterhub_gpupool.pool.codes import CODES
        from jupyterhub_gpupool.service.apihandlers.errors import STATUS

        rows = [
            [[nodes.literal(c.name, c.name)], [nodes.Text(str(STATUS[c.name]))], _inline(c.meaning)]
            for c in sorted(CODES.values(), key=lambda c: (STATUS[c.name], c.name))
        ]
        return [_table(["code", "status", "meaning"], rows, [25, 10, 65])]


def setup(app) -> dict:
    app.add_directive("refusal-codes", RefusalCodesDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
