"""The demo hub: dummy login, the pool service managed by the hub, the pool's local spawner.

Run by ``jupyterhub-gpupool demo``, which sets the ``GPUPOOL_DEMO_*`` variables read here.
"""

import os
from pathlib import Path

import yaml

from jupyterhub_gpupool.demo import DEMO_ADMIN, DEMO_USERS
from jupyterhub_gpupool.hubconfig import configure_hub, configure_job_runner

c = get_config()  # type: ignore[name-defined]  # noqa: F821  JupyterHub's loader defines it
env = os.environ
state = Path(env["GPUPOOL_DEMO_STATE"])
python = env.get("GPUPOOL_DEMO_PYTHON", "python3")
bindir = Path(python).parent

c.JupyterHub.ip = env.get("GPUPOOL_DEMO_IP", "127.0.0.1")
c.JupyterHub.port = int(env.get("GPUPOOL_DEMO_PORT", "8000"))
# the launcher picks the ports (they follow --port: lifecycle.demo_ports)
c.JupyterHub.hub_port = int(env.get("GPUPOOL_DEMO_HUB_PORT", c.JupyterHub.port + 81))
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
c.ConfigurableHTTPProxy.command = [env["GPUPOOL_DEMO_PROXY"]]
proxy_api_port = int(env.get("GPUPOOL_DEMO_PROXY_API_PORT", c.JupyterHub.port + 1))
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")

c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {*DEMO_USERS, DEMO_ADMIN}
c.Authenticator.admin_users = {DEMO_ADMIN}

service_port = int(env.get("GPUPOOL_DEMO_SERVICE_PORT", c.JupyterHub.port + 2101))
configure_hub(
    c,
    spawner_token=env["GPUPOOL_DEMO_SPAWNER_TOKEN"],
    pool_config=env["GPUPOOL_DEMO_POOL"],
    db_url=f"sqlite:///{state / 'gpupool.sqlite'}",
    service_url=f"http://127.0.0.1:{service_port}",
    command=[python, "-m", "jupyterhub_gpupool.cli", "service"],
    service_args=[
        "--upgrade-db",
        f"--PoolService.telemetry_source={env.get('GPUPOOL_DEMO_TELEMETRY', 'sim')}",
        *env.get("GPUPOOL_DEMO_SERVICE_ARGS", "").split(),  # --short-reclaim's kernel timers
    ],
    admin_users=[DEMO_ADMIN],
    spawner="simple",
    reclaimer=True,  # the idle-GPU reclaimer, as a hub-managed service
)

c.Spawner.cmd = [str(bindir / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
if os.geteuid() == 0:  # containers and CI machines often run as root
    c.Spawner.args = ["--allow-root"]
c.Spawner.start_timeout = 120
c.SimpleLocalProcessSpawner.home_dir_template = str(state / "home" / "{username}")
c.GPUPoolSpawnerMixin.queue_poll_interval = 1.0
# the lab package (jupyterlab-gpupool, installed by `make demo`): every server, CPU-only ones
# too, is told where the pool is, so the GPU panel can offer them a GPU; the simulated GPUs
# have no NVML on the servers, so the panel shows the pool's readings and says so
c.Spawner.environment = {
    "GPUPOOL_API_URL": f"http://127.0.0.1:{service_port}/services/gpupool/api/v1/",
}
c.Spawner.args = [*c.Spawner.args, "--GPUPoolLab.nvml_module="]
# GPU kernels (jupyterhub_gpupool.kernels, the `kernels` extra that `make demo` installs): each
# server writes its user's "Python 3 (GPU: <offer>)" kernelspecs at start, so a CPU-only server
# can run one notebook on a GPU leased for that kernel alone
c.Spawner.args = [
    *c.Spawner.args,
    "--ServerApp.jpserver_extensions=jupyterhub_gpupool.kernels=True",
]

# jobs (`jupyterhub-gpupool job submit`, `jobs.submit` in a notebook): on one machine the hub runs
# the job runner for every node of the demo pool, starting jobs in their user's home folder
with open(env["GPUPOOL_DEMO_POOL"]) as pool_file:
    demo_nodes = [n["name"] for n in (yaml.safe_load(pool_file) or {}).get("nodes") or []]
configure_job_runner(
    c,
    demo_nodes,
    service_url=f"http://127.0.0.1:{service_port}",
    args=[
        f"--JobRunner.workdir={state / 'jobs'}",
        f"--JobRunner.home_template={state / 'home' / '{username}'}",
    ],
)
