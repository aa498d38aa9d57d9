"""The production image's install, read from the Dockerfile so the two cannot drift: its wheel
stage's build line and its image stage's ``pip install`` line run in new virtualenvs, then the
image's three commands run from that venv against real PostgreSQL and a real hub: the pool
service, a node agent on the simulated NVML whose inventory reaches the service, and the
hub-managed reclaimer; all stop cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from jupyterhub_gpupool.data import data_path
from tests.fakes import HubEnv, free_port, request, wait_reconciled, wait_until
from tests.freshvenv import (
    INSTALL_PATIENCE,
    ROOT,
    clean_env,
    dockerfile_stages,
    installed,
    make_venv,
    python_steps,
    run,
    source_copy,
)

pytestmark = [pytest.mark.slow, pytest.mark.install]

DOCKERFILE = ROOT / "Dockerfile"
NODE = "sim-t4"

RECLAIMER = """
from jupyterhub_gpupool.hubconfig import configure_reclaimer
configure_reclaimer(
    c,
    service_url={api!r}.rsplit("/services/", 1)[0],
    command=[{command!r}, "reclaimer"],
    args=["--interval=0.5", "--metrics-port={metrics_port}", "--log-level=INFO"],
)
"""


def image_venv(base: Path) -> Path:
    """The two stages' Python steps, as the Dockerfile writes them: the wheel built in one
    venv from a copy of the source (``COPY . .``), installed in another; its ``bin``."""
    stages = dockerfile_stages(DOCKERFILE.read_text())
    assert len(stages) == 2, "the Dockerfile has a wheel stage and an image stage"
    steps = [s for cmd in stages[0] for s in python_steps(cmd)]
    build = steps[-1]
    install = [s for cmd in stages[1] for s in python_steps(cmd)]
    assert len(install) == 1 and "/wheels/" in install[0], install
    assert build.startswith("python -m build") and "/wheels" in build
    wheels = base / "wheels"
    src = source_copy(base / "src")
    for where, commands in (("build", steps), ("image", install)):
        bin_dir = make_venv(base / where)
        env = clean_env(PATH=f"{bin_dir}{os.pathsep}{clean_env()['PATH']}")
        for command in commands:
            line = command.replace("/wheels", str(wheels))
            run(["bash", "-c", line], src, env, timeout=INSTALL_PATIENCE)
    return base / "image" / "bin"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return image_venv(tmp_path_factory.mktemp("image"))


def test_the_image_install_has_its_extras_and_no_test_tools(image):
    have = installed(image)
    assert {"jupyterhub-gpupool", "psycopg", "nvidia-ml-py", "httpx"} <= have
    for absent in ("numpy", "jupyterlab", "pytest", "build"):
        assert absent not in have, f"{absent} is in the image's install"


def test_service_agent_and_reclaimer_run_from_the_image_install(image, pg_url, tmp_path):
    metrics_port = free_port()
    command = str(image / "jupyterhub-gpupool")
    env = HubEnv(
        tmp_path,
        pg_url,
        None,  # no pool config: the node is known only from its agent's inventory
        python=(str(image / "python"),),
        service_args=("--PoolService.housekeeping_interval=1", "--log-level=INFO"),
        extra_config=RECLAIMER.replace("{command!r}", repr(command)).replace(
            "{metrics_port}", str(metrics_port)
        ),
    )
    with env.running():
        wait_reconciled(env)
        admin = env.token("admin")
        # the service is the image's: its process runs the fresh venv's interpreter
        assert env.service is not None
        assert Path(os.readlink(f"/proc/{env.service.pid}/exe")).resolve() == (
            (image / "python").resolve()
        )
        assert request("GET", f"{env.api.rsplit('/api/v1', 1)[0]}/health").status == 200

        agent = subprocess.Popen(
            [
                command,
                "agent",
                f"--service-url={env.api}",
                f"--node={NODE}",
                "--interval=0.5",
                "--source=sim",
                f"--pool-config={data_path('demo-pool.yaml')}",
            ],
            cwd=tmp_path,
            env=clean_env(GPUPOOL_AGENT_TOKEN=env.agent_token),
            stdout=open(tmp_path / "agent.log", "wb"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:

            def inventory() -> list[str]:
                pool = request("GET", f"{env.api}/pool", admin).json()
                return [n["name"] for c in pool["clusters"] for n in c["nodes"]]  # type: ignore[index]

            wait_until(
                lambda: NODE in inventory() or agent.poll() is not None,
                90,
                "the agent's inventory in the pool",
                step=0.3,
                info=lambda: (tmp_path / "agent.log").read_text(errors="replace"),
            )
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()
            os.killpg(agent.pid, signal.SIGTERM)
            assert agent.wait(60) == 0, (tmp_path / "agent.log").read_text()
            assert "Agent stopped" in (tmp_path / "agent.log").read_text()
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(60)

        reclaimer_health = f"http://127.0.0.1:{metrics_port}/health"

        def reclaimer_healthy() -> bool:
            try:
                return request("GET", reclaimer_health).status == 200
            except OSError:
                return False

        wait_until(reclaimer_healthy, 120, "the reclaimer's health check", step=0.3, info=env.logs)

        def led() -> list[dict]:
            events = request("GET", f"{env.api}/events?limit=1000", admin).json()["items"]  # type: ignore[index]
            return [e for e in events if e["kind"] == "reclaim-leader"]

        taken = wait_until(led, 120, "the reclaimer to lead the pool's rounds", step=0.3)
        assert taken[0]["actor"] == "service:gpupool-reclaimer"
        service = env.service
    # stopped by the fixture: the service with SIGTERM, then the hub (which stops its
    # managed reclaimer); both say so, and the service exited 0
    assert service.returncode == 0, env.logs()
    text = (tmp_path / "service.log").read_text(errors="replace")
    assert "GPU pool service stopped" in text and "Traceback" not in text, text
    assert "died" not in text, text  # the store process stops in order, whoever got SIGTERM
    # the agent's first samples follow its inventory at once: the service knew the GPUs
    assert "not a GPU of this pool" not in text, text
    hub_text = (tmp_path / "hub.log").read_text(errors="replace")
    assert "Reclaimer stopped" in hub_text, hub_text[-3000:]
