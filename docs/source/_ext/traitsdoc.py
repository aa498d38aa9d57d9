"""``traits-config`` directive: the configuration reference, generated from the traits.

Every configurable trait has a default and a help string (a test checks that), so the reference
is never out of date: it is rendered from the classes at build time.
"""

from __future__ import annotations

import importlib

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList


class TraitsConfig(Directive):
    """Render ``module.Class``'s configurable traits (its own, not those it inherits)."""

    required_arguments = 1

    def run(self) -> list:
        module, _, name = self.arguments[0].rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        lines = []
        for trait_name, trait in sorted(cls.class_own_traits(config=True).items()):
            default = trait.default_value_repr()
            lines += [
                f"``{cls.__name__}.{trait_name}`` : {type(trait).__name__}",
                f"    Default: ``{default}``",
                "",
                *("    " + line for line in (trait.help or "").splitlines()),
                "",
            ]
        container = StringList(lines, source=self.arguments[0])
        section = nodes.container()
        self.state.nested_parse(container, self.content_offset, section)
        return section.children


def setup(app) -> dict:
    app.add_directive("traits-config", TraitsConfig)
    return {"parallel_read_safe": True}
