"""``quick_init``: a frozen dataclass built as fast as a plain one.

A frozen dataclass's generated ``__init__`` sets each field through ``object.__setattr__``
(its own ``__setattr__`` refuses), several times slower than a plain store; the writer builds
a ``PoolState`` (some 55 fields), ``LeaseFacts`` and a ``LeaseView`` for every command of a
batch, which made that a visible share of a batch's CPU (``benchmarks/hotpath_calls.py``).
``quick_init`` gives such a class an ``__init__`` of the same signature and defaults (a default
factory still called per instance) that fills the instance's ``__dict__`` at once. The class
stays frozen (assignment still raises), and compares, hashes, prints and pickles as before.

The price: an instance with a real ``__dict__`` reads each attribute about three times slower
than one with CPython's inline attribute values (3.11). So only for values built per command
and read a few times each; not for long-lived ones read in the allocator's loops (``Request``,
``Slot``, ``Shape``, ``Grant``), where the reads outweigh the faster build.
"""

from __future__ import annotations

import inspect
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, TypeVar

T = TypeVar("T")


class _Factory:
    """The default of a field with a default factory (call it), shown as dataclasses do."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()
_DICT = "_quick_init_dict"  # the __init__'s local name for the instance's __dict__


def quick_init(cls: type[T]) -> type[T]:
    """Give the frozen dataclass ``cls`` the fast ``__init__`` (see the module); its
    ``__post_init__``, if any, still runs last. Refused (``TypeError``) for a class it would
    not fit: slots (no ``__dict__``), ``init=False`` fields, ``InitVar`` parameters."""
    params = getattr(cls, "__dataclass_params__", None)
    if not is_dataclass(cls) or params is None or not params.frozen:
        raise TypeError(f"{cls.__name__}: quick_init is for frozen dataclasses")
    if "__slots__" in cls.__dict__:
        raise TypeError(f"{cls.__name__}: quick_init needs the instance's __dict__")
    made = fields(cls)
    expected = list(inspect.signature(cls.__init__).parameters)[1:]
    if any(not f.init for f in made) or sorted(expected) != sorted(f.name for f in made):
        raise TypeError(f"{cls.__name__}: quick_init takes no init=False field nor InitVar")
    if {"self", _DICT} & {f.name for f in made}:
        raise TypeError(f"{cls.__name__}: a field's name is one quick_init's __init__ uses")
    names: dict[str, Any] = {"_FACTORY": _FACTORY}
    positional: list[str] = ["self"]
    kw_only: list[str] = []
    body = [f"{_DICT} = self.__dict__"]
    for f in made:
        name = f.name
        if f.default is not MISSING:
            names[f"_d_{name}"] = f.default
            param = f"{name}=_d_{name}"
            body.append(f"{_DICT}[{name!r}] = {name}")
        elif f.default_factory is not MISSING:
            names[f"_f_{name}"] = f.default_factory
            param = f"{name}=_FACTORY"
            body.append(f"{_DICT}[{name!r}] = _f_{name}() if {name} is _FACTORY else {name}")
        else:
            param = name
            body.append(f"{_DICT}[{name!r}] = {name}")
        (kw_only if f.kw_only else positional).append(param)
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    signature = ", ".join(positional + (["*", *kw_only] if kw_only else []))
    exec(f"def __init__({signature}):\n    " + "\n    ".join(body), names)  # as dataclasses
    init = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[method-assign]  # the point: replace dataclasses' own
    return cls
