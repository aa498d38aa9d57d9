"""GPU kernels on demand from a CPU-only server (issue 36): the ``gpupool`` kernel provisioner
asks the pool for a lease held by the kernel alone and pins the kernel to the granted device;
kernelspecs "Python 3 (GPU: <offer>)" are written from the offers the user may use."""

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """The server extension that keeps the GPU kernelspecs in step with the pool's offers."""
    return [{"module": "jupyterhub_gpupool.kernels.extension"}]


def __getattr__(name: str) -> Any:  # the provisioner imports jupyter_client: only when asked
    if name == "GpuPoolProvisioner":
        from .provisioner import GpuPoolProvisioner

        return GpuPoolProvisioner
    raise AttributeError(name)
