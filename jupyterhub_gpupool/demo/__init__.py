"""``jupyterhub-gpupool demo``: JupyterHub with the GPU pool on one machine, in one command.

The launcher picks the GPUs (simulated by default; this machine's real ones where NVML finds
them), keeps its state (hub and pool databases, tokens, users' home folders) in one folder, and
runs JupyterHub with ``jupyterhub_config.py`` from this package: a demo authenticator, the pool
service managed by the hub, and the pool's local spawner. It prints the URL and the demo users
once the hub answers. A second demo on the same state folder or port refuses at once; Ctrl-C,
SIGTERM or SIGHUP stop everything the demo started (``lifecycle.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from . import lifecycle

DEMO_USERS = ("alice", "bob", "carol")
DEMO_ADMIN = "admin"
HERE = Path(__file__).resolve().parent
#: Seconds the hub gets to stop users' servers, the pool service and the proxy on its own.
HUB_PATIENCE = 60.0
#: ``--short-reclaim``: the pool file's ``reclaim`` section for watching the whole loop in a
#: few minutes. A GPU idle (no kernel busy, nobody at the keyboard) for 1 min gets a notice
#: that ends 1 min later; the reclaimer's rounds (every 30 s) add at most one round to each.
SHORT_RECLAIM: dict[str, Any] = {
    "default": {
        "idle_timeout": "2m",
        "pressure_idle_timeout": "2m",
        "cpu_busy_timeout": "10m",
        "warn_before": "1m",
        "busy_grace": "30s",
        "extension": "5m",
        "min_runtime": "1m",
    }
}
#: ``--short-reclaim`` for GPU kernels (the pool service's ``kernel_idle_timeout`` and
#: ``kernel_notice``, seconds): a GPU kernel that runs nothing for 1 min gets its notice (the
#: open notebook is saved), and is shut down a minute later unless a cell runs.
SHORT_KERNEL_RECLAIM: dict[str, float] = {"kernel_idle_timeout": 60.0, "kernel_notice": 60.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's flags."""
    parser.add_argument("--ip", default="127.0.0.1", help="address to listen on (%(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="public port (%(default)s)")
    parser.add_argument(
        "--state-dir",
        default=os.path.join(os.path.expanduser("~"), ".local/share/jupyterhub-gpupool/demo"),
        help="where the demo keeps databases, tokens and home folders (%(default)s)",
    )
    parser.add_argument(
        "--gpus",
        choices=("auto", "sim", "real"),
        default="auto",
        help="simulated GPUs (sim), this machine's through NVML (real), or real when NVML "
        "finds any (auto, the default)",
    )
    parser.add_argument(
        "--pool-config",
        help="a pool YAML instead of the built-in demo pool (simulated GPUs only)",
    )
    parser.add_argument(
        "--proxy",
        help="configurable-http-proxy command (default: ./.node/node_modules/.bin/, then PATH)",
    )
    parser.add_argument(
        "--fresh", action="store_true", help="start from empty databases (deletes the state dir)"
    )
    parser.add_argument(
        "--short-reclaim",
        action="store_true",
        help="reclaim idle GPUs on short timers to watch the loop: a notice after about a "
        "minute of idle, the reclaim a minute later (replaces the pool file's reclaim section; "
        "GPU kernels: a notice after a minute of running nothing, the shutdown a minute later)",
    )


def find_proxy(explicit: str | None = None) -> str:
    """configurable-http-proxy: the given one, ``make``'s local npm install, or PATH."""
    if explicit:
        return explicit
    for base in (Path.cwd(), HERE.parents[1]):
        local = base / ".node" / "node_modules" / ".bin" / "configurable-http-proxy"
        if local.exists():
            return str(local)
    found = shutil.which("configurable-http-proxy")
    if not found:
        raise OSError(
            "configurable-http-proxy not found: run `make demo` from the repository, or "
            "`npm install -g configurable-http-proxy`"
        )
    return found


def nvml_gpu_count() -> int:
    """How many GPUs NVML sees here (0 without a driver or without nvidia-ml-py)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def pool_from_inventory(inventory: dict[str, Any]) -> dict[str, Any]:
    """A pool config for this machine's real GPUs: one whole-GPU offer per model, one MIG
    offer per profile already carved (nodes come from the in-process NVML reader)."""
    from ..pool.catalog import default_catalog

    catalog = default_catalog()
    offers: dict[str, dict[str, Any]] = {}
    for gpu in inventory.get("gpus", []):
        model = catalog.model_for_nvml(gpu["model"], gpu.get("memory_mib", 0))
        slug = model.name.lower().replace(" ", "-")
        mig = gpu.get("mig") or {}
        if mig.get("enabled"):
            for inst in mig.get("instances", []):
                name = f"{slug}-{inst['profile']}".replace(".", "-").replace("+", "-")
                offers.setdefault(
                    name,
                    {
                        "name": name,
                        "kind": "mig",
                        "profile": inst["profile"],
                        "models": [model.name],
                        "display_name": f"{model.name} · {inst['profile']} slice",
                    },
                )
        else:
            offers.setdefault(
                slug,
                {
                    "name": slug,
                    "kind": "gpu",
                    "count": 1,
                    "models": [model.name],
                    "display_name": f"1× {model.name}",
                },
            )
    return {"offers": list(offers.values()), "quotas": {"default": {"guarantee": 1, "limit": 2}}}


def _token(path: Path) -> str:
    if not path.exists():
        path.write_text(secrets.token_hex(32))
        path.chmod(0o600)
    return path.read_text().strip()


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(url, timeout=2)
            return True
        except OSError:  # HTTPError too: an orphaned proxy answers 404 for a hub that is gone
            time.sleep(0.3)
    return False


def _empty(state: Path) -> None:
    """``--fresh``: delete what the state folder holds, except the lock this demo holds."""
    for entry in state.iterdir():
        if entry.name == lifecycle.LOCK_NAME:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def prepare(
    args: argparse.Namespace, ports: dict[str, int] | None = None
) -> tuple[dict[str, str], Path]:
    """Set up the state folder and the environment the demo's hub config reads."""
    state = Path(args.state_dir).expanduser().resolve()
    if args.fresh and state.exists():
        _empty(state)
    (state / "home").mkdir(parents=True, exist_ok=True)
    ports = ports or lifecycle.demo_ports(args.port, dict(os.environ))
    gpus = args.gpus
    if gpus == "auto":
        gpus = "real" if nvml_gpu_count() > 0 else "sim"
    if gpus == "real":
        if args.pool_config:
            raise ValueError("--pool-config is for simulated GPUs; real ones are read by NVML")
        from ..telemetry.nvml import NvmlReader

        reader = NvmlReader()
        try:
            config = pool_from_inventory(reader.inventory())
        finally:
            reader.close()
        pool_config = state / "pool-real.yaml"
        pool_config.write_text(yaml.safe_dump(config, sort_keys=False))
        source = "nvml"
    else:
        pool_config = Path(args.pool_config or HERE.parent / "data" / "demo-pool.yaml").resolve()
        if not pool_config.exists():
            raise OSError(f"no pool config at {pool_config}")
        source = "sim"
    if getattr(args, "short_reclaim", False):
        config = yaml.safe_load(pool_config.read_text()) or {}
        config["reclaim"] = SHORT_RECLAIM
        pool_config = state / "pool-short-reclaim.yaml"
        pool_config.write_text(yaml.safe_dump(config, sort_keys=False))
        service_args = [f"--PoolService.{k}={v:g}" for k, v in SHORT_KERNEL_RECLAIM.items()]
    else:
        service_args = []
    env = dict(os.environ)
    env.update(
        GPUPOOL_DEMO_STATE=str(state),
        GPUPOOL_DEMO_IP=args.ip,
        GPUPOOL_DEMO_PORT=str(args.port),
        GPUPOOL_DEMO_PROXY_API_PORT=str(ports["proxy API"]),
        GPUPOOL_DEMO_HUB_PORT=str(ports["hub API"]),
        GPUPOOL_DEMO_SERVICE_PORT=str(ports["pool service"]),
        GPUPOOL_DEMO_POOL=str(pool_config),
        GPUPOOL_DEMO_TELEMETRY=source,
        GPUPOOL_DEMO_PROXY=find_proxy(args.proxy),
        GPUPOOL_DEMO_SPAWNER_TOKEN=_token(state / "spawner-token"),
        GPUPOOL_DEMO_PYTHON=sys.executable,
        GPUPOOL_DEMO_SERVICE_ARGS=" ".join(service_args),
    )
    return env, state


class _Stop(BaseException):
    """SIGINT, SIGTERM or SIGHUP, raised where the launcher waits."""


def _raise_stop(signum: int, _frame: object) -> None:
    raise _Stop(signum)


def run_cli(args: argparse.Namespace) -> int:
    """Run the demo until Ctrl-C, SIGTERM or SIGHUP, then stop everything it started.

    Refuses at once (one line, exit 1, nothing of the running demo touched) when a demo holds
    the state folder or one of the ports.
    """
    state = Path(args.state_dir).expanduser().resolve()
    url = f"http://{args.ip}:{args.port}"
    ports = lifecycle.demo_ports(args.port, dict(os.environ))
    lock = lifecycle.StateLock(state)
    try:
        lock.acquire(url, args.port)
        lifecycle.stop_leftovers(state)
        lifecycle.check_ports(args.ip, ports, state)
    except lifecycle.DemoRunning as e:
        lock.release()
        print(e, file=sys.stderr)
        return 1
    lifecycle.become_subreaper()
    # SIGINT too: a shell starts background jobs with it ignored, and Python then leaves it so
    signal.signal(signal.SIGINT, _raise_stop)
    signal.signal(signal.SIGTERM, _raise_stop)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # nohup means it
        signal.signal(signal.SIGHUP, _raise_stop)
    hub: subprocess.Popen[bytes] | None = None
    try:
        env, state = prepare(args, ports)
        config = HERE / "jupyterhub_config.py"
        log = open(state / "jupyterhub.log", "ab")  # noqa: SIM115 - lives as long as the hub
        hub = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(config)],
            cwd=state,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        print(f"Starting JupyterHub with the GPU pool ({env['GPUPOOL_DEMO_TELEMETRY']} GPUs)…")
        print(f"  log: {state / 'jupyterhub.log'}")
        if not _wait(f"{url}/hub/api/", hub):
            print(f"JupyterHub did not start; see {state / 'jupyterhub.log'}", file=sys.stderr)
            return 1
        users = ", ".join(DEMO_USERS)
        print(
            f"\n  JupyterHub with the GPU pool is running at {url}/\n"
            f"  Log in as {users} (users) or {DEMO_ADMIN} (pool admin), any password.\n"
            f"  Pool API: {url}/services/gpupool/api/v1/pool (with a token from {url}/hub/token)\n"
            "  Ctrl-C stops it.\n",
            flush=True,
        )
        if getattr(args, "short_reclaim", False):
            print(
                "  Short reclaim timers: leave a server's GPU idle (close the tab) and a notice\n"
                "  comes within about 2 minutes on Services → gpupool and in JupyterLab;\n"
                "  the reclaim follows a minute later. A GPU kernel that runs nothing for a\n"
                "  minute gets its notice in its notebook, and is shut down a minute later.\n",
                flush=True,
            )
        while hub.poll() is None:
            lifecycle.reap_orphans(keep={hub.pid})
            with contextlib.suppress(subprocess.TimeoutExpired):
                hub.wait(2)
        return hub.returncode
    except (KeyboardInterrupt, _Stop):
        return 0
    finally:
        _shutdown(hub)
        lock.release()


def _shutdown(hub: subprocess.Popen[bytes] | None) -> None:
    """Let the hub stop users' servers, the pool service and the proxy (it does on SIGTERM);
    then end whatever of the demo still runs. A second Ctrl-C skips the wait."""
    if hub is not None and hub.poll() is None:
        print("\nStopping the demo (users' servers, the pool service, the proxy, the hub)…")
        with contextlib.suppress(ProcessLookupError):
            hub.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired, KeyboardInterrupt, _Stop):
            hub.wait(HUB_PATIENCE)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the rest is bounded: about 15 s at most
    lifecycle.stop_everything()
    if hub is not None and hub.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(hub.pid, signal.SIGKILL)
