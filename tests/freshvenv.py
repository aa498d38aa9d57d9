"""Fresh virtual environments holding exactly what one documented install gives.

The test venv has every extra, so a module that imports a package only an extra brings passes
every other test. These helpers make a new venv per documented path (``pip install .``, the
Dockerfile's install line, ``make demo``) from a copy of the source as a clone has it, so the
tests in ``tests/install/`` run the project the way its users first meet it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Installing JupyterHub and its dependencies from pip's cache on a loaded 2-core machine.
INSTALL_PATIENCE = 900


def source_copy(dest: Path) -> Path:
    """The files a clone of this tree has (tracked, and new ones git does not ignore), copied
    to ``dest``: no venv, no build output, no state of a demo run here."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        src = ROOT / name
        if not src.exists():  # deleted in the working tree, not yet in the index
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)
    return dest


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points at the test venv or the source tree."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PIP_REQUIRE_VIRTUALENV"}
    }
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env.update(extra)
    return env


def make_venv(where: Path) -> Path:
    """A new venv at ``where`` with the interpreter's own pip only; returns its ``bin``."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(where)], check=True, env=clean_env())
    return where / "bin"


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600):
    """Run ``argv``; fail with its output when it fails."""
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{argv} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def installed(bin_dir: Path) -> set[str]:
    """The distributions installed in the venv of ``bin_dir`` (normalised names)."""
    out = run([str(bin_dir / "python"), "-m", "pip", "list", "--format=freeze"], bin_dir).stdout
    return {
        re.split(r"[=<>@ ]", line, maxsplit=1)[0].lower().replace("_", "-") for line in out.split()
    }


def dockerfile_stages(text: str) -> list[list[str]]:
    """The RUN commands of each stage of a Dockerfile, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    stages: list[list[str]] = []
    for line in joined.splitlines():
        line = line.strip()
        if line.upper().startswith("FROM "):
            stages.append([])
        elif line.upper().startswith("RUN ") and stages:
            stages[-1].append(line[4:].strip())
    return stages


def python_steps(command: str) -> list[str]:
    """The ``pip install`` and ``python -m build`` steps of one RUN command (the rest,
    ``useradd``, ``rm``, belong to the image, not to the Python install)."""
    steps = [part.strip() for part in command.split("&&")]
    return [s for s in steps if s.startswith(("pip install", "python -m build"))]
