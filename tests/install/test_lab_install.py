"""The users' image install of ``docs/source/howto/lab-extension-admin.md`` in a new virtualenv:
``pip install . ./labextension`` (the lab package depends on ``jupyterhub-gpupool`` for the pool's
one API client). The server extension is enabled, its modules import, and importing them loads
none of the pool's database stack."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.freshvenv import INSTALL_PATIENCE, installed, make_venv, run, source_copy

pytestmark = [pytest.mark.slow, pytest.mark.install]


@pytest.fixture(scope="module")
def user_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding ``pip install . ./labextension`` and nothing else; its ``bin``."""
    base = tmp_path_factory.mktemp("lab")
    src = source_copy(base / "src")
    bin_dir = make_venv(base / "venv")
    run(
        [str(bin_dir / "pip"), "install", "--quiet", ".", "./labextension"],
        src,
        timeout=INSTALL_PATIENCE,
    )
    return bin_dir


def test_the_lab_package_brings_the_client_and_nothing_of_the_extras(user_image):
    have = installed(user_image)
    assert {"jupyterhub-gpupool", "jupyterlab-gpupool", "jupyterhub", "jupyter-server"} <= have
    for extra in ("psycopg", "numpy", "scipy", "pytest", "jupyterhub-kubespawner"):
        assert extra not in have, f"{extra} came with the lab package"
    code = "from importlib.metadata import requires; print(requires('jupyterlab-gpupool'))"
    needs = run([str(user_image / "python"), "-c", code], user_image).stdout
    assert "jupyterhub-gpupool" in needs, needs  # declared, not there by luck of the line


def test_the_server_extension_is_enabled_and_imports_light(user_image):
    listed = run([str(user_image / "jupyter"), "server", "extension", "list"], user_image)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)  # its colours
    assert "jupyterlab_gpupool enabled" in plain and "jupyterlab_gpupool 0.1.0 OK" in plain
    code = (
        "import json, sys\n"
        "import jupyterlab_gpupool.extension, jupyterlab_gpupool.pool, jupyterlab_gpupool.fanout\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    loaded = set(json.loads(run([str(user_image / "python"), "-c", code], user_image).stdout))
    assert "jupyterhub_gpupool" in loaded
    assert not loaded & {"sqlalchemy", "alembic", "numpy"}, sorted(loaded)
