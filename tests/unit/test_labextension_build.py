"""The prebuilt lab extension: the committed build is that of the committed sources, and
``pip wheel ./labextension`` makes a wheel with the frontend, the server extension's config
and the package, with no Node on the machine (the build hook skips what is built)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "labextension"
BUILT = LAB / "jupyterlab_gpupool" / "labextension"


def source_hash() -> str:
    """As labextension/scripts/stamp.js computes it (src/ but its tests, style/, the
    package, tsconfig and lock files)."""

    def files(folder: str) -> list[str]:
        out = []
        for p in sorted((LAB / folder).rglob("*")):
            rel = p.relative_to(LAB).as_posix()
            if p.is_file() and "/__tests__/" not in f"/{rel}":
                out.append(rel)
        return out

    names = sorted([*files("src"), *files("style"), "package.json", "tsconfig.json", "yarn.lock"])
    h = hashlib.sha256()
    for name in names:
        h.update(name.encode() + b"\0")
        h.update((LAB / name).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def test_the_committed_build_is_of_the_committed_sources():
    stamp = (BUILT / "build-source.sha256").read_text().strip()
    assert stamp == source_hash(), (
        "labextension/src (or style, package.json, yarn.lock) changed after the build: run "
        "`jlpm build:prod` in labextension/ and commit jupyterlab_gpupool/labextension/"
    )
    assert list((BUILT / "static").glob("remoteEntry.*.js"))
    assert (LAB / "yarn.lock").stat().st_size > 0
    assert "nodeLinker: node-modules" in (LAB / ".yarnrc.yml").read_text()


@pytest.mark.slow
def test_the_wheel_carries_the_prebuilt_frontend_and_needs_no_node(tmp_path: Path):
    bin_dir = tmp_path / "bin"  # a PATH with Python and nothing else: no node, no jlpm
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env = {**os.environ, "PATH": str(bin_dir)}
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(LAB)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = tmp_path.glob("jupyterlab_gpupool-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = next(n.split("/")[0] for n in names if ".data/" in n)
    share = f"{data}/data/share/jupyter/labextensions/jupyterlab-gpupool"
    assert f"{share}/package.json" in names and f"{share}/install.json" in names
    assert any(n.startswith(f"{share}/static/remoteEntry.") for n in names)
    assert f"{data}/data/etc/jupyter/jupyter_server_config.d/jupyterlab_gpupool.json" in names
    assert "jupyterlab_gpupool/fanout.py" in names and "jupyterlab_gpupool/_version.py" in names
