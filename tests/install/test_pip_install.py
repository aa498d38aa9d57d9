"""``pip install .`` in a new virtualenv, as ``docs/source/howto/install.md`` documents it: the
service runs on SQLite, answers its health check and stops cleanly; every long-running part
imports with what this install gives; an extra it lacks is one line naming the extra."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.fakes import free_port, request, wait_until
from tests.freshvenv import (
    INSTALL_PATIENCE,
    clean_env,
    installed,
    make_venv,
    run,
    source_copy,
)

pytestmark = [pytest.mark.slow, pytest.mark.install]

#: The modules of every long-running part a plain install documents (the Kubernetes spawner
#: needs the `kubernetes` extra, the lab server extension its own package).
PARTS = (
    "jupyterhub_gpupool.service.app",
    "jupyterhub_gpupool.telemetry.agent",
    "jupyterhub_gpupool.reclaim.app",
    "jupyterhub_gpupool.spawner.local",
    "jupyterhub_gpupool.demo",
    "jupyterhub_gpupool.report",
    "jupyterhub_gpupool.hubconfig",
    "jupyterhub_gpupool.jobs.app",
    "jupyterhub_gpupool.jobs.cli",
)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding ``pip install .`` and nothing else; its ``bin``."""
    base = tmp_path_factory.mktemp("plain")
    src = source_copy(base / "src")
    bin_dir = make_venv(base / "venv")
    run([str(bin_dir / "pip"), "install", "--quiet", "."], src, timeout=INSTALL_PATIENCE)
    return bin_dir


def test_the_plain_install_brings_no_extra(plain):
    have = installed(plain)
    assert "jupyterhub-gpupool" in have
    for extra in ("psycopg", "numpy", "scipy", "nvidia-ml-py", "jupyterlab", "pytest"):
        assert extra not in have, f"{extra} came with a plain install"


def test_every_long_running_part_imports(plain):
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    run([str(plain / "python"), "-c", code, *PARTS], plain)
    for command in ("service", "agent", "reclaimer", "job-runner", "job"):
        helped = run([str(plain / "jupyterhub-gpupool"), command, "--help"], plain)
        assert "--" in helped.stdout


def test_the_service_runs_on_sqlite_and_stops_cleanly(plain, tmp_path):
    port = free_port()
    env = clean_env(
        JUPYTERHUB_API_TOKEN="no-hub-here",
        JUPYTERHUB_SERVICE_URL=f"http://127.0.0.1:{port}",
        JUPYTERHUB_API_URL=f"http://127.0.0.1:{free_port()}/hub/api",
    )
    log = tmp_path / "service.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(plain / "jupyterhub-gpupool"), "service", "--log-level=INFO"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    health = f"http://127.0.0.1:{port}/services/gpupool/health"

    def answered() -> bool:
        if proc.poll() is not None:
            return True
        try:
            return request("GET", health).status == 200
        except OSError:
            return False

    try:
        wait_until(answered, 120, "the service's health check", step=0.3, info=log.read_text)
        assert proc.poll() is None, log.read_text()
        assert request("GET", health).json()["status"] == "ok"
        assert (tmp_path / "jupyterhub-gpupool.sqlite").exists()  # the documented default
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, log.read_text()
    text = log.read_text()
    assert "GPU pool service stopped" in text and "Traceback" not in text, text


def test_a_missing_extra_is_one_line_naming_it(plain, tmp_path):
    def command(*args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(plain / "jupyterhub-gpupool"), *args],
            cwd=tmp_path,
            env=clean_env(**env),
            capture_output=True,
            text=True,
            timeout=120,
        )

    postgres = command("upgrade-db", "--db-url=postgresql://u@127.0.0.1/x")
    assert postgres.returncode == 1
    assert postgres.stderr.count("\n") == 1, postgres.stderr
    assert "pip install 'jupyterhub-gpupool[postgres]'" in postgres.stderr

    service = command("service", "--db-url=postgresql://u@127.0.0.1/x", JUPYTERHUB_API_TOKEN="x")
    assert service.returncode != 0
    assert "pip install 'jupyterhub-gpupool[postgres]'" in service.stderr
    assert "Traceback" not in service.stderr, service.stderr

    packing = command("simulate", "packing", "--pods", "p.csv")
    assert packing.returncode == 1
    assert packing.stderr.count("\n") == 1, packing.stderr
    assert "pip install 'jupyterhub-gpupool[simulate]'" in packing.stderr

    # the user's own kernelspec folder is Jupyter's: the kernels extra brings jupyter_core
    specs = command("kernelspecs", "--api-url=http://127.0.0.1:9/api/v1", "--token=x")
    assert specs.returncode == 1
    assert specs.stderr.count("\n") == 1, specs.stderr
    assert "pip install 'jupyterhub-gpupool[kernels]'" in specs.stderr
