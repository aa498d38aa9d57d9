"""The lab package's local NVML readings on real GPUs: every GPU and every MIG device is read
by its UUID, as the server extension reads the device in ``CUDA_VISIBLE_DEVICES``. Read-only;
skipped with the reason where pynvml, libnvidia-ml or a GPU is missing."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.hardware

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed")
pytest.importorskip("jupyterlab_gpupool", reason="make test installs ./labextension")


def uuids() -> list[str]:
    """Every GPU's UUID and every MIG device's (NVML's own answers)."""
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        gpu = pynvml.nvmlDeviceGetHandleByIndex(i)
        out.append(pynvml.nvmlDeviceGetUUID(gpu))
        try:
            current, _ = pynvml.nvmlDeviceGetMigMode(gpu)
        except pynvml.NVMLError:
            continue
        if current:
            for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)):
                try:
                    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, j)
                except pynvml.NVMLError:
                    continue
                out.append(pynvml.nvmlDeviceGetUUID(mig))
    return out


def test_every_device_reads_by_its_uuid():
    from jupyterlab_gpupool.localgpu import LocalGPU

    local = LocalGPU("pynvml")
    if not local.available:
        pytest.skip(local.reason)
    found = uuids()
    if not found:
        pytest.skip("NVML finds no GPU")
    reading = local.read(found)
    assert reading["available"] and reading["reason"] == ""
    assert [d["uuid"] for d in reading["devices"]] == found
    for d in reading["devices"]:
        assert d["memory_total_mib"] > 0 and 0 <= d["memory_used_mib"] <= d["memory_total_mib"]
        assert d["processes"] is None or d["processes"] >= 0
        if d["uuid"].startswith("MIG-"):
            assert d["util"] is None  # NVML has no utilization for MIG devices
        else:
            assert d["util"] is None or 0 <= d["util"] <= 100
