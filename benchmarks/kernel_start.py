"""GPU kernel start overhead: lease + process start, over ``--starts`` starts (issue 36).

A real hub and the pool service run as in the integration tests (``tests/integration/
hubenv.py``, SQLite, one simulated H100); the kernelspecs are written from the pool's offers
as ``jupyterhub-gpupool kernelspecs`` writes them, and each start is jupyter_client's
AsyncKernelManager with the ``gpupool-provisioner`` (the user's server token, as in a
pool-spawned server), timed from ``start_kernel`` to the kernel answering ``kernel_info``,
then shut down (its lease released). The same is timed for a plain local ipykernel (no
provisioner) in alternation, so the difference is the pool's part. No model is loaded: this
is what a notebook waits for before its first cell may run. Goal: ≤ 2 s per GPU kernel start.

Run ``python benchmarks/kernel_start.py`` (configurable-http-proxy on PATH); figures are
printed and written to ``benchmarks/results/kernel_start.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402

from jupyterhub_gpupool.kernels.kernelspecs import spec_name, write_kernelspecs  # noqa: E402
from tests.integration.hubenv import HubEnv, request  # noqa: E402

POOL = """
nodes:
  - name: box
    gpus:
      - {model: H100-80GB, count: 1}
offers:
  - {name: h100, kind: gpu, count: 1, models: [H100-80GB], display_name: "1x H100"}
quotas:
  default: {guarantee: 1, limit: 1}
"""


async def one_start(specs: KernelSpecManager, name: str) -> float:
    """Seconds from ``start_kernel`` to the kernel's first answer; then it is shut down."""
    km = AsyncKernelManager(kernel_name=name, kernel_spec_manager=specs)
    t0 = time.perf_counter()
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        took = time.perf_counter() - t0
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
    return took


def summary(xs: list[float]) -> dict[str, float]:
    return {
        "mean_s": round(statistics.mean(xs), 3),
        "median_s": round(statistics.median(xs), 3),
        "max_s": round(max(xs), 3),
        "min_s": round(min(xs), 3),
    }


async def measure(env: HubEnv, kernels: Path, starts: int) -> dict[str, Any]:
    token = env.server_token("alice")
    os.environ["GPUPOOL_API_URL"], os.environ["JUPYTERHUB_API_TOKEN"] = env.api, token
    offers = request("GET", f"{env.api}/offers", token).json()["items"]  # type: ignore[index]
    write_kernelspecs(offers, kernels)
    plain = json.loads((kernels / spec_name("h100") / "kernel.json").read_text())
    plain["metadata"].pop("kernel_provisioner")
    (kernels / "plain").mkdir()
    (kernels / "plain" / "kernel.json").write_text(json.dumps(plain))
    specs = KernelSpecManager(kernel_dirs=[str(kernels)])
    await one_start(specs, "plain")  # warm the file cache and imports once, not counted
    gpu, local = [], []
    for _ in range(starts):
        gpu.append(await one_start(specs, spec_name("h100")))
        local.append(await one_start(specs, "plain"))
    pool = [g - p for g, p in zip(gpu, local, strict=True)]
    return {
        "starts": starts,
        "gpu_kernel": summary(gpu),
        "plain_kernel": summary(local),
        "pool_part": summary(pool),
        "goal_s": 2.0,
        "met": statistics.median(gpu) <= 2.0,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--json", default=str(HERE / "results" / "kernel_start.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        (where / "pool.yaml").write_text(POOL)
        env = HubEnv(where, f"sqlite:///{where}/pool.sqlite", where / "pool.yaml", ("alice",))
        with env.running():
            result = asyncio.run(measure(env, where / "kernels", args.starts))
    print(json.dumps(result, indent=1))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
