"""Every ``# type: ignore`` in the type-checked code names its error code and says why.

mypy (``make lint``) already refuses an ignore without a code (``ignore-without-code``) and one
that silences nothing (``warn_unused_ignores``); the reason is this test's part. The packages
that ``[tool.mypy]`` skips (``ignore_errors``; none since issue 34's commands landed) are left
out here too, read from the same table so the two cannot drift apart.
"""

from __future__ import annotations

import io
import re
import tokenize
from fnmatch import fnmatch
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
#: mypy's module names of the checked trees → their folders (spawner/ is checked as `spawner`).
TREES = {
    "jupyterhub_gpupool": ROOT / "jupyterhub_gpupool",
    "spawner": ROOT / "spawner",
    "jupyterlab_gpupool": ROOT / "labextension" / "jupyterlab_gpupool",
}
#: ``# type: ignore[code, code]`` followed by a comment with words in it.
GOOD = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(,\s*[a-z-]+)*\]\s+#\s*\S")
ANY_IGNORE = re.compile(r"#\s*type:\s*ignore")


def mypy_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]


def skipped_patterns() -> list[str]:
    """Module patterns whose errors mypy ignores for now."""
    return [
        m
        for o in mypy_config().get("overrides", [])
        if o.get("ignore_errors")
        for m in ([o["module"]] if isinstance(o["module"], str) else o["module"])
    ]


def module_of(path: Path) -> str:
    for top, folder in TREES.items():
        if path.is_relative_to(folder):
            rel = path.relative_to(folder).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            return ".".join([top, *parts])
    raise AssertionError(f"{path} is in no checked tree")


def skipped(module: str, patterns: list[str]) -> bool:
    return any(fnmatch(module, p) or (p.endswith(".*") and module == p[:-2]) for p in patterns)


def bad_ignores(source: str) -> list[int]:
    """Lines of ``source`` with a ``type: ignore`` comment lacking a code or a reason."""
    bad = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        is_ignore = tok.type == tokenize.COMMENT and ANY_IGNORE.search(tok.string)
        if is_ignore and not GOOD.search(tok.string):
            bad.append(tok.start[0])
    return bad


def test_the_checker_tells_a_reasoned_ignore_from_a_bare_one():
    assert bad_ignores("x = f()  # type: ignore[arg-type]  # JSON, checked above\n") == []
    assert bad_ignores("x = f()  # type: ignore[attr-defined,no-any-return]  # see above\n") == []
    assert bad_ignores("x = f()  # type: ignore\n") == [1]
    assert bad_ignores("x = f()  # type: ignore[arg-type]\n") == [1]
    assert bad_ignores("x = 1\ny = f()  # type: ignore[misc]  #\n") == [2]
    # a string that merely mentions it is not a comment
    assert bad_ignores('s = "# type: ignore"\n') == []


def test_the_skipped_packages_are_the_ones_being_rewritten():
    # what issue 34 rewrites around typed commands, less those that have joined the strict
    # check since (the list only shrinks); anything else added here needs a reason
    assert set(skipped_patterns()) <= {
        "jupyterhub_gpupool.store.*",
        "jupyterhub_gpupool.service.*",
        "jupyterhub_gpupool.poolclient",
        "spawner.*",
        "jupyterlab_gpupool.*",
    }
    assert mypy_config()["strict"] is True
    assert "ignore-without-code" in mypy_config()["enable_error_code"]


def test_every_type_ignore_in_checked_code_names_its_code_and_a_reason():
    patterns = skipped_patterns()
    checked = [
        p
        for folder in TREES.values()
        for p in sorted(folder.rglob("*.py"))
        if "__pycache__" not in p.parts and not skipped(module_of(p), patterns)
    ]
    assert len(checked) > 80  # pool/, kube/, telemetry/, simulate/, reclaim/, top-level, ...
    bad = [
        f"{p.relative_to(ROOT)}:{line}"
        for p in checked
        for line in bad_ignores(p.read_text(encoding="utf-8"))
    ]
    assert not bad, "type: ignore without [code]  # reason:\n" + "\n".join(bad)
