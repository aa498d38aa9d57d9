"""The explicit package list in pyproject.toml must cover every package folder, and the wheel
must carry the data files: a missing entry ships a broken install that tests in-tree never see."""

import subprocess
import sys

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> tuple[set[str], dict[str, str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return set(config["packages"]), config.get("package-dir", {})


def _folders(top: Path) -> list[Path]:
    """``top`` and every folder below it that holds a file (data-only folders too: migrations,
    templates), not caches."""
    return sorted(
        {
            f.parent
            for f in top.rglob("*")
            if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"
        }
    )


def _on_disk() -> set[str]:
    found = set()
    for folder in _folders(ROOT / "jupyterhub_gpupool"):
        found.add(".".join(folder.relative_to(ROOT).parts))
    for folder in _folders(ROOT / "spawner"):
        rel = folder.relative_to(ROOT / "spawner")
        found.add(".".join(("jupyterhub_gpupool", "spawner", *rel.parts)))
    return found


def test_every_package_folder_is_declared():
    declared, _ = _declared()
    assert _on_disk() == declared


def test_spawner_folder_is_mapped_and_not_duplicated():
    _, package_dir = _declared()
    assert package_dir == {"jupyterhub_gpupool.spawner": "spawner"}
    assert not (ROOT / "jupyterhub_gpupool" / "spawner").exists()


def test_wheel_contents(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    # an undeclared folder makes setuptools print ~40 lines each on every install (`make demo`)
    output = built.stdout + built.stderr
    assert "absent from the `packages` configuration" not in output, output
    assert "BuildBackendWarning" not in output, output
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "jupyterhub_gpupool/data/mig_profiles.json" in names
    assert "jupyterhub_gpupool/alembic/env.py" in names
    assert "jupyterhub_gpupool/alembic/script.py.mako" in names
    assert "jupyterhub_gpupool/alembic/versions/0001_initial_schema.py" in names
    assert "jupyterhub_gpupool/service/templates/user.html" in names
    assert "jupyterhub_gpupool/spawner/__init__.py" in names
    assert "jupyterhub_gpupool/spawner/templates/gpupool_form.html" in names
    assert "jupyterhub_gpupool/demo/jupyterhub_config.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[jupyterhub.spawners]" in text and "gpupool-kube = " in text
    assert "jupyterhub_gpupool/pool/allocator.py" in names
    assert not any(n.startswith(("spawner/", "tests/", "benchmarks/")) for n in names)
