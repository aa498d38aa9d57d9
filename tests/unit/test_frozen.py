"""``pool.frozen.quick_init``: a frozen dataclass with the fast ``__init__`` builds, compares,
refuses assignment, copies (``replace``) and pickles exactly as the stock one does, and the
classes the writer builds per command have it."""

from __future__ import annotations

import inspect
import pickle
from dataclasses import MISSING, FrozenInstanceError, InitVar, dataclass, field, fields, replace

import pytest

from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.pool.facts import LeaseFacts, Outcome, PoolState
from jupyterhub_gpupool.pool.frozen import quick_init
from jupyterhub_gpupool.store.read.leases import LeaseView, SlotView


def _pair() -> tuple[type, type]:
    """The same class twice: with the stock ``__init__`` and with ``quick_init``'s."""

    def make() -> type:
        @dataclass(frozen=True)
        class Value:
            name: str
            size: int = 1
            tags: list[str] = field(default_factory=list)
            note: str = field(default="", kw_only=True)

            def __post_init__(self) -> None:
                if self.size < 0:
                    raise ValueError("negative size")
                object.__setattr__(self, "_double", 2 * self.size)

        return Value

    return make(), quick_init(make())


@pytest.mark.parametrize(
    "args, kwargs",
    [(("a",), {}), (("a", 3), {}), (("a", 3, ["x"]), {"note": "n"}), ((), {"name": "b"})],
)
def test_builds_what_the_stock_init_builds(args, kwargs):
    stock, quick = _pair()
    a, b = stock(*args, **kwargs), quick(*args, **kwargs)
    assert vars(a) == vars(b)  # the fields and what __post_init__ set
    assert repr(a).replace("Value", "") == repr(b).replace("Value", "")


def test_same_signature_and_the_same_refusals():
    stock, quick = _pair()
    assert str(inspect.signature(stock)) == str(inspect.signature(quick))
    for bad_args, bad_kwargs in [((), {}), (("a", 1, [], "n"), {}), (("a",), {"nope": 1})]:
        with pytest.raises(TypeError):
            stock(*bad_args, **bad_kwargs)
        with pytest.raises(TypeError):
            quick(*bad_args, **bad_kwargs)
    with pytest.raises(ValueError, match="negative size"):
        quick("a", -1)  # __post_init__ still runs


def test_stays_frozen_fresh_defaults_replace_and_pickle():
    _, quick = _pair()
    v = quick("a", 2)
    with pytest.raises(FrozenInstanceError):
        v.size = 3
    assert quick("a").tags is not quick("a").tags  # a default factory per instance
    assert replace(v, size=5) == quick("a", 5)
    assert v == quick("a", 2) and hash(quick("a", 2, ())) == hash(quick("a", 2, ()))


def test_pickles_as_the_stock_class():
    # a module-level class: pickle finds it by name (a view crosses the writer's pipe)
    view = SlotView("GPU-1", "mig", "1g.10gb", 0, 0, "MIG-1")
    assert pickle.loads(pickle.dumps(view)) == view
    ask = commands.Allocate("alice", "s", "a100", clusters=("c",), actor="user:alice")
    again = pickle.loads(pickle.dumps(ask))
    assert again == ask and again.actor == "user:alice"


def test_refuses_what_it_would_not_build_alike():
    @dataclass
    class Plain:
        x: int

    @dataclass(frozen=True, slots=True)
    class Slotted:
        x: int

    @dataclass(frozen=True)
    class Hidden:
        x: int
        y: int = field(default=0, init=False)

    @dataclass(frozen=True)
    class WithInitVar:
        x: int
        scale: InitVar[int] = 1

        def __post_init__(self, scale: int) -> None:
            pass

    @dataclass(frozen=True)
    class SelfNamed:
        self: int  # the __init__'s own first parameter

    for cls in (Plain, Slotted, Hidden, WithInitVar, SelfNamed):
        with pytest.raises(TypeError):
            quick_init(cls)


@pytest.mark.parametrize(
    "cls",
    [
        PoolState,
        LeaseFacts,
        Outcome,
        LeaseView,
        SlotView,
        commands.Allocate,
        commands.Release,
        commands.Keepalive,
    ],
    ids=lambda c: c.__name__,
)
def test_the_writers_per_command_values_have_it(cls):
    """Each of these is built once or more per command of a writer batch and read a few times
    (``benchmarks/hotpath_calls.py --batch``): the stock frozen ``__init__`` cost a visible
    share of the batch's CPU."""
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"
    # dataclasses' own frozen __init__ sets each field through object.__setattr__
    assert "__dataclass_builtins_object__" not in cls.__init__.__code__.co_names
    assert sorted(inspect.signature(cls).parameters) == sorted(f.name for f in fields(cls))


def test_a_pool_state_has_each_default():
    state = PoolState(None)  # type: ignore[arg-type]  # no allocator needed to compare
    for f in fields(PoolState)[1:]:
        want = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        assert getattr(state, f.name) == want, f.name
    assert PoolState(None).leases is not PoolState(None).leases  # type: ignore[arg-type]
