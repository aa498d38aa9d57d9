"""The store's parts put together: one implementation per method, so that no behaviour
depends on the order ``Store``'s parts are listed in (issue 34). What differs by a lease's
holder is a rule of ``pool/holders.py`` the one method asks, not an override."""

from __future__ import annotations

from collections import defaultdict

from jupyterhub_gpupool.store import Store


def test_no_store_method_is_defined_by_two_parts():
    defined: dict[str, list[str]] = defaultdict(list)
    for part in Store.__mro__[:-1]:
        for name, value in vars(part).items():
            if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
                defined[name].append(part.__name__)
    # settings of their own are the one exception: each part takes its keywords
    twice = {n: parts for n, parts in defined.items() if len(parts) > 1 and n != "__init__"}
    assert twice == {}, f"methods overridden across the store's parts: {twice}"
