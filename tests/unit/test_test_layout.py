"""The test suite's own layout: shared fakes have one home (the ``tests/fakes/`` package).

A test module that imports helpers from another test module makes the second one a library
nobody owns (and pytest collects the helper's module twice over); the hub environment is reached
through ``tests.fakes`` only, so there is one place to look for what tests share.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

#: The only modules under tests/ that may import the hub harness directly: the package
#: ``tests.fakes`` and its modules.
HUBENV = "tests.integration.hubenv"
HUBENV_IMPORTER = "tests.fakes"


def may_import_hubenv(module: str) -> bool:
    return module in (HUBENV, HUBENV_IMPORTER) or module.startswith(HUBENV_IMPORTER + ".")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    """Every module the file at ``path`` imports."""
    return imports_of(
        path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py"
    )


def imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the code of ``module``) imports: relative imports resolved, and
    ``from pkg import name`` counts ``pkg.name`` too, as ``name`` may be a module."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def is_test_module(name: str) -> bool:
    return name.split(".")[0] == "tests" and name.rsplit(".", 1)[-1].startswith("test_")


def python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_test_module_imports_another():
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in python_files()
        for name in sorted(imported_modules(path))
        if is_test_module(name)
    ]
    assert not offenders, "move shared helpers into tests/fakes/:\n" + "\n".join(offenders)


def test_the_hub_environment_is_reached_through_fakes():
    offenders = [
        str(path.relative_to(ROOT))
        for path in python_files()
        if not may_import_hubenv(module_name(path))
        and any(n == HUBENV or n.startswith(HUBENV + ".") for n in imported_modules(path))
    ]
    assert not offenders, f"import HubEnv and friends from tests.fakes: {offenders}"


def test_the_scan_sees_every_spelling():
    """The checks above catch each way of writing the import (relative ones resolved from a
    module of tests/integration/)."""
    spellings = {
        "from tests.unit.test_store import make_store": "tests.unit.test_store",
        "from ..unit.test_store import make_store": "tests.unit.test_store",
        "from ..unit import test_store": "tests.unit.test_store",
        "from . import test_service": "tests.integration.test_service",
        "from .test_service import _metric": "tests.integration.test_service",
        "import tests.unit.test_agent": "tests.unit.test_agent",
        "from .hubenv import HubEnv": HUBENV,
    }
    for source, target in spellings.items():
        found = imports_of(source, "tests.integration.test_example")
        assert target in found, (source, found)
    assert is_test_module("tests.unit.test_store") and not is_test_module("tests.fakes")
    assert not is_test_module("jupyterhub_gpupool.test_helpers")


def test_only_fakes_may_import_the_hub_environment():
    """The package and its modules may; a module that merely starts with its name may not."""
    assert may_import_hubenv("tests.fakes") and may_import_hubenv("tests.fakes.hub")
    assert not may_import_hubenv("tests.fakes_extra")
    assert not may_import_hubenv("tests.integration.test_service")
    assert module_name(TESTS / "fakes" / "__init__.py") == "tests.fakes"
