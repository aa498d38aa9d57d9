"""Typed commands: every one is applied by exactly one store method whose parameters are its
fields, declares whether it may share a batch, survives the trip to the writer's child process,
and is listed in the architecture reference."""

from __future__ import annotations

import asyncio
import inspect
import pickle
import re
from dataclasses import MISSING, FrozenInstanceError, fields
from datetime import datetime
from pathlib import Path

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.service.writer import BatchWriter
from jupyterhub_gpupool.store import Store
from jupyterhub_gpupool.store.dispatch import appliers, table
from tests.fakes import make_store

ARCHITECTURE = Path(__file__).parents[2] / "docs/source/reference/architecture.md"


def test_every_command_has_one_store_method_and_every_entry_is_a_command():
    every = set(commands.every_command())
    assert every == set(table(Store)), "a command without its store method, or the reverse"
    methods = [m.__name__ for m in table(Store).values()]
    assert len(set(methods)) == len(methods), "two commands applied by one method"


@pytest.mark.parametrize("kind", commands.every_command(), ids=lambda k: k.__name__)
def test_fields_are_the_methods_parameters_in_order_with_its_defaults(kind):
    """A command passes its fields by name; their order and defaults are the method's, so
    ``Release(lease_id)`` means what ``store.release(lease_id)`` meant."""
    params = [
        p for p in inspect.signature(table(Store)[kind]).parameters.values() if p.name != "self"
    ]
    own = [f for f in fields(kind) if f.name != "actor"]
    assert [f.name for f in own] == [p.name for p in params if p.name != "actor"]
    for f, p in zip(own, [p for p in params if p.name != "actor"], strict=True):
        default = f.default if f.default is not MISSING else inspect.Parameter.empty
        assert default == p.default, f"{kind.__name__}.{f.name}"
    actor = (
        next(p for p in params if p.name == "actor") if appliers(Store)[kind].takes_actor else None
    )
    if actor is not None:
        assert next(f for f in fields(kind) if f.name == "actor").default == actor.default


def test_batchable_is_declared_on_the_type():
    """Only those that refuse before they write may share a transaction."""
    batchable = {k.__name__ for k in commands.every_command() if k.batchable}
    assert batchable == {"Allocate", "Release", "Keepalive", "ExpireGrants", "Promote"}


def test_commands_are_values_that_pickle():
    """The process writer sends them to its child; equal by value, not changed in flight."""
    cmd = commands.Release("l1", reason="admin", actor="admin:root")
    assert pickle.loads(pickle.dumps(cmd)) == cmd
    assert cmd == commands.Release("l1", reason="admin", actor="admin:root")
    with pytest.raises(FrozenInstanceError):
        cmd.reason = "stopped"  # type: ignore[misc]  # frozen: the test shows it refuses
    later = commands.PruneMinutes(datetime(2026, 3, 1))
    assert pickle.loads(pickle.dumps(later)) == later


def test_the_writer_refuses_anything_but_a_command(db_url, clock):
    upgrade(db_url)
    store = make_store(db_url, clock)
    writer = BatchWriter(store)
    writer.start()
    try:
        for bad in (commands.Command(), store.release, ("release", "l1")):
            with pytest.raises(ValueError, match="not a store write"):
                asyncio.run(writer.run(bad))  # type: ignore[arg-type]  # deliberately wrong
    finally:
        writer.stop()


def _listed() -> dict[str, str]:
    """The commands table of the architecture reference: name → batchable column."""
    text = ARCHITECTURE.read_text()
    section = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|[^|]*\|[^|]*\| (yes|no) \|$", section, re.M)
    return dict(rows)


def test_architecture_lists_every_command_and_only_those():
    listed = _listed()
    every = {k.__name__: k for k in commands.every_command()}
    assert set(every) - set(listed) == set(), "commands missing from architecture.md"
    assert set(listed) - set(every) == set(), "architecture.md lists commands that do not exist"
    for name, flag in listed.items():
        assert (flag == "yes") == every[name].batchable, f"{name}: batchable column is wrong"
