"""Imports point one way: no cycles, every module imports on its own, and the layers hold.

The graph comes from the source (AST), not from running it, so an import inside a function (a
lazy import that only closes a cycle when that function runs) counts like any other; only
``if TYPE_CHECKING:`` blocks are left out, since they never run. The top-level ``spawner/``
folder is the ``jupyterhub_gpupool.spawner`` package (pyproject's package-dir).
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "jupyterhub_gpupool"
PACKAGE_DIRS = {PROJECT: ROOT / "jupyterhub_gpupool", f"{PROJECT}.spawner": ROOT / "spawner"}

#: Modules that are files of the package but not meant to be imported, and why.
NOT_IMPORTABLE = {
    f"{PROJECT}.demo.jupyterhub_config": "a hub config file, run by JupyterHub with get_config()",
}


@dataclass(frozen=True)
class Import:
    """One imported name, made absolute, with its line and whether it is lazy."""

    target: str
    line: int
    lazy: bool  # inside a function: runs when the function does, not at import time


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _is_import_module(node: ast.AST) -> bool:
    """``importlib.import_module("absolute.name")`` with a literal name."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    func = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
    arg = node.args[0]
    return (
        func == "import_module"
        and isinstance(arg, ast.Constant)
        and isinstance(arg.value, str)
        and not arg.value.startswith(".")
    )


class ImportGraph:
    """The modules of some packages and which of them import which."""

    def __init__(self, package_dirs: Mapping[str, Path], root: Path) -> None:
        self.root = root
        self.package_dirs = package_dirs
        self.modules: dict[str, Path] = {}
        self.shadowed: list[str] = []
        self.components: list[list[str]] = []  # set by cycles()
        for name, folder in package_dirs.items():
            self._walk(name, folder)
        self.imports = {name: self._imports(name, path) for name, path in self.modules.items()}
        self.edges: dict[str, dict[str, Import]] = {}  # module → module it imports → first import
        for name, found in self.imports.items():
            self.edges[name] = {}
            for imp in found:
                target = self.module_of(imp.target)
                if target is not None and target != name:
                    self.edges[name].setdefault(target, imp)

    def _walk(self, name: str, folder: Path) -> None:
        if not (folder / "__init__.py").is_file():
            return
        self.modules[name] = folder / "__init__.py"
        for py in sorted(folder.glob("*.py")):
            if py.stem != "__init__":
                self.modules[f"{name}.{py.stem}"] = py
        for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
            sub_name = f"{name}.{sub.name}"
            if sub_name in self.package_dirs:
                continue
            if (sub / "__init__.py").is_file() and (folder / f"{sub.name}.py").is_file():
                self.shadowed.append(f"{sub_name} ({sub.name}/ hides {sub.name}.py)")
            self._walk(sub_name, sub)

    def _imports(self, name: str, path: Path) -> list[Import]:
        """Absolute names ``name`` imports; ``from X import y`` names ``X.y`` if that is one of
        our modules, else ``X``."""
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: list[Import] = []

        def visit(node: ast.AST, lazy: bool) -> None:
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                for child in node.orelse:
                    visit(child, lazy)
                return
            if isinstance(node, ast.Import):
                found.extend(Import(a.name, node.lineno, lazy) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                if base != "__future__":
                    for alias in node.names:
                        sub = f"{base}.{alias.name}"
                        found.append(
                            Import(sub if sub in self.modules else base, node.lineno, lazy)
                        )
            elif _is_import_module(node):
                found.append(Import(node.args[0].value, node.lineno, lazy))  # type: ignore[attr-defined]
            inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for child in ast.iter_child_nodes(node):
                visit(child, inner)

        visit(ast.parse(path.read_text(), str(path)), False)
        return found

    def module_of(self, target: str) -> str | None:
        """The most specific of our modules an import of ``target`` runs (None: not ours)."""
        while target:
            if target in self.modules:
                return target
            target = target.rpartition(".")[0]
        return None

    def short(self, name: str) -> str:
        return name.removeprefix(f"{PROJECT}.")

    def edge(self, a: str, b: str) -> str:
        imp = self.edges[a][b]
        where = f"{self.modules[a].relative_to(self.root)}:{imp.line}"
        lazy = ", inside a function" if imp.lazy else ""
        return f"{self.short(a)} → {self.short(b)}  ({where}{lazy})"

    def cycles(self) -> list[list[str]]:
        """Each strongly connected component of several modules, as its shortest cycle."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        components: list[list[str]] = []

        def connect(v: str) -> None:  # Tarjan; the graph is small enough to recurse
            index[v] = low[v] = len(index)
            stack.append(v)
            on_stack.add(v)
            for w in self.edges[v]:
                if w not in index:
                    connect(w)
                    low[v] = min(low[v], low[w])
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                component = []
                while (w := stack.pop()) != v:
                    on_stack.discard(w)
                    component.append(w)
                on_stack.discard(v)
                if component:
                    components.append(sorted([v, *component]))

        for v in sorted(self.edges):
            if v not in index:
                connect(v)
        self.components = sorted(components)
        shortest = []
        for component in self.components:
            tries = (self._path(s, s, set(component)) for s in component)
            shortest.append(min((c for c in tries if c), key=len))
        return shortest

    def _path(
        self, start: str, goal: str, within: set[str] | None = None, stop: Callable | None = None
    ) -> list[str]:
        """Shortest path ``start`` → ``goal`` ([] if none), only through ``within`` if given,
        never on past a module ``stop`` accepts."""
        paths = {start: [start]}
        frontier = [start]
        while frontier:
            nxt = []
            for v in frontier:
                for w in sorted(self.edges[v]):
                    if w == goal:
                        return [*paths[v], w]
                    if w not in paths and (within is None or w in within):
                        paths[w] = [*paths[v], w]
                        if stop is None or not stop(w):
                            nxt.append(w)
            frontier = nxt
        return []

    def cycle_report(self) -> str:
        """Each cycle edge by edge, and the other modules caught in the same knot."""
        parts = []
        for cycle, component in zip(self.cycles(), self.components, strict=True):
            steps = "\n".join(f"  {self.edge(a, b)}" for a, b in itertools.pairwise(cycle))
            others = sorted(set(component) - set(cycle))
            tangled = f"\n  (tangled in it too: {', '.join(map(self.short, others))})"
            parts.append(
                f"cycle {' → '.join(map(self.short, cycle))}:\n{steps}{tangled if others else ''}"
            )
        return "\n\n".join(parts)

    def layer_violations(
        self, layer: str, bad_module: Callable[[str], bool], bad_external: set[str]
    ) -> list[str]:
        """What ``layer``'s modules import, directly or through other modules of ours, that they
        must not; each with the path there (which stops at the first module it must not reach)."""
        out = set()
        for name in sorted(m for m in self.modules if m == layer or m.startswith(f"{layer}.")):
            for reached in sorted(self.modules):
                path = [name] if reached == name else self._path(name, reached, stop=bad_module)
                if not path:
                    continue
                chain = " → ".join(self.short(m) for m in path)
                if reached != name and bad_module(reached):
                    out.add(f"{chain}\n    last step: {self.edge(path[-2], path[-1])}")
                    continue
                for imp in self.imports[reached]:
                    if imp.target.partition(".")[0] in bad_external:
                        where = f"{self.modules[reached].relative_to(self.root)}:{imp.line}"
                        out.add(f"{chain} → {imp.target}  ({where})")
        return sorted(out)

    def module_level_externals(self) -> list[str]:
        """Modules not ours that ours import at import time (not inside functions)."""
        return sorted(
            {
                imp.target
                for imports in self.imports.values()
                for imp in imports
                if not imp.lazy and self.module_of(imp.target) is None
            }
            - set(self.package_dirs)
        )


GRAPH = ImportGraph(PACKAGE_DIRS, ROOT)


def _in(package: str) -> Callable[[str], bool]:
    return lambda m: m == package or m.startswith(f"{package}.")


def test_the_scan_sees_the_whole_project():
    assert _in(PROJECT)(f"{PROJECT}.spawner.kube") and f"{PROJECT}.spawner.kube" in GRAPH.modules
    assert f"{PROJECT}.pool.placement" in GRAPH.edges[f"{PROJECT}.pool.allocator"]


def test_no_package_shadows_a_module():
    assert GRAPH.shadowed == [], "a package and a module of the same name: " + ", ".join(
        GRAPH.shadowed
    )


def test_no_import_cycles():
    cycles = GRAPH.cycles()
    assert not cycles, f"{len(cycles)} import cycle(s):\n\n{GRAPH.cycle_report()}"


def test_pool_is_pure_domain():
    # data/ holds the shipped MIG table and the helper that finds it; timeparse is the one ISO
    # 8601 reader (standard library only); neither imports anything else of ours
    pool, leaves = _in(f"{PROJECT}.pool"), {f"{PROJECT}.data", f"{PROJECT}.timeparse"}
    bad = GRAPH.layer_violations(
        f"{PROJECT}.pool",
        lambda m: m not in leaves and not pool(m),
        {"tornado", "sqlalchemy", "pynvml"},
    )
    assert not bad, "pool/ must import only pool/ (and data/, timeparse):\n" + "\n".join(bad)
    assert not GRAPH.edges[f"{PROJECT}.timeparse"], "timeparse must import nothing of ours"


def _store_or_service(m: str) -> bool:
    return GRAPH.short(m).split(".")[0] in ("store", "service")


def test_telemetry_does_not_reach_the_store_or_the_service():
    bad = GRAPH.layer_violations(f"{PROJECT}.telemetry", _store_or_service, {"sqlalchemy"})
    assert not bad, (
        "telemetry/ must not import the store (store/), the service or SQLAlchemy, "
        "directly or through other modules:\n" + "\n".join(bad)
    )


def test_the_reclaimer_talks_http_only():
    """The reclaimer reaches the pool through its REST API (poolclient), never its store."""
    bad = GRAPH.layer_violations(f"{PROJECT}.reclaim", _store_or_service, {"sqlalchemy"})
    assert not bad, (
        "reclaim/ must not import the store, the service or SQLAlchemy, directly or through "
        "other modules:\n" + "\n".join(bad)
    )


#: Who may hold the allocator (``Store.locked``): the store, and the writer's warm-up.
MAY_LOCK = (f"{PROJECT}.store", f"{PROJECT}.service.writer")


def locked_calls(path: Path) -> list[int]:
    """The lines of ``path`` that call a ``.locked(...)`` method."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "locked"
    ]


def test_only_the_store_holds_the_allocator():
    """Outside the store, code reads the pool state through the store's typed views (issue
    34): a ``store.locked()`` elsewhere reads the allocator's internals, which only the store
    may (the writer builds it once at start)."""
    bad = [
        f"{GRAPH.modules[name].relative_to(ROOT)}:{line}"
        for name in sorted(GRAPH.modules)
        if not any(name == m or name.startswith(f"{m}.") for m in MAY_LOCK)
        for line in locked_calls(GRAPH.modules[name])
    ]
    assert not bad, "only store/ (and service/writer.py) may call .locked():\n" + "\n".join(bad)
    assert locked_calls(GRAPH.modules[f"{PROJECT}.store.panel"]), "the scan finds the store's"


def test_the_checker_finds_lazy_cycles_and_layer_breaks(tmp_path):
    """On a made-up package: a lazy import closes a cycle, TYPE_CHECKING does not, relative
    imports resolve, and a layer break two steps away is found with its path."""
    pkg = tmp_path / "demo_pkg"
    (pkg / "core").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/a.py": "from . import b\n",
        "core/b.py": "def f():\n    from .c import x\n",
        "core/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..io import y\n"
        "from demo_pkg.core import a\n",
        "core/d.py": "from ..glue import z\n",
        "glue.py": "import importlib\nimportlib.import_module('demo_pkg.io')\n",
        "io.py": "import sqlalchemy\n",
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    graph = ImportGraph({"demo_pkg": pkg}, tmp_path)
    assert graph.cycles() == [[f"demo_pkg.core.{m}" for m in "abca"]]
    assert "core/b.py:2, inside a function" in graph.cycle_report()
    assert "demo_pkg.io" not in graph.edges["demo_pkg.core.c"]
    broken = graph.layer_violations("demo_pkg.core", lambda m: m == "demo_pkg.io", set())
    assert broken == [
        "demo_pkg.core.d → demo_pkg.glue → demo_pkg.io\n"
        "    last step: demo_pkg.glue → demo_pkg.io  (demo_pkg/glue.py:2)"
    ]
    leaks = graph.layer_violations("demo_pkg.core", lambda m: False, {"sqlalchemy"})
    assert leaks == [
        "demo_pkg.core.d → demo_pkg.glue → demo_pkg.io → sqlalchemy  (demo_pkg/io.py:1)"
    ]


# ---------------------------------------------------------------------------------------------
# Each module imports on its own

# Third-party and stdlib modules are imported once, in the parent; every child is forked from
# it before any module of ours is loaded and imports exactly one, so a module that only works
# when something else of ours was imported first fails here.
_IMPORT_ALONE = textwrap.dedent(
    """
    import importlib, json, os, sys, traceback
    preload, names = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    for ext in preload:
        try:
            importlib.import_module(ext)
        except Exception:
            pass  # optional extras; the child reports what its module really needs
    assert not any(m.split(".")[0] == "jupyterhub_gpupool" for m in sys.modules)
    results = {}
    for name in names:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                importlib.import_module(name)
                status = 0
            except BaseException:
                os.write(write, traceback.format_exc(limit=-6).encode()[-4000:])
                status = 1
            os._exit(status)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            error = pipe.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
        results[name] = error or (None if status == 0 else f"exit status {status}")
    print(json.dumps(results))
    """
)
IMPORTABLE = sorted(set(GRAPH.modules) - set(NOT_IMPORTABLE))


@pytest.fixture(scope="module")
def import_results() -> dict[str, str | None]:
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork to import each module in a fresh process cheaply")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _IMPORT_ALONE,
            json.dumps(GRAPH.module_level_externals()),
            json.dumps(IMPORTABLE),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", IMPORTABLE, ids=GRAPH.short)
def test_module_imports_on_its_own(name, import_results):
    error = import_results[name]
    assert error is None, f"import {name} alone fails:\n{error}"
