"""The NVML reader against real GPUs: inventory, utilization and MIG slices.

Read-only: never changes MIG mode and never creates or destroys instances. Skipped with the
reason where pynvml is missing, libnvidia-ml cannot be loaded or NVML sees no GPU.
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.hardware

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed")


@pytest.fixture(scope="module")
def reader():
    from jupyterhub_gpupool.telemetry.nvml import NvmlReader, NvmlUnavailable

    try:
        r = NvmlReader(pynvml)
    except NvmlUnavailable as e:
        pytest.skip(f"no usable NVML here: {e}")
    if pynvml.nvmlDeviceGetCount() == 0:
        r.close()
        pytest.skip("NVML finds no GPU")
    yield r
    r.close()


def test_inventory_matches_nvml(reader):
    inv = reader.inventory()
    assert len(inv["gpus"]) == pynvml.nvmlDeviceGetCount()
    for g in inv["gpus"]:
        h = pynvml.nvmlDeviceGetHandleByIndex(g["index"])
        assert g["uuid"] == pynvml.nvmlDeviceGetUUID(h)
        assert g["model"] == pynvml.nvmlDeviceGetName(h)
        assert g["memory_mib"] > 1024
        assert isinstance(g["healthy"], bool)
        for inst in g["mig"]["instances"]:
            assert isinstance(inst["start"], int) and inst["profile"]


def test_catalog_knows_the_gpu(reader):
    for g in reader.inventory()["gpus"]:
        model = reader.catalog.model_for_nvml(g["model"], g["memory_mib"])
        if g["mig"]["enabled"]:
            assert model.mig_capable, f"{g['model']} runs MIG but the catalog has no profiles"


def test_samples_cover_every_gpu_or_slice(reader):
    inv = reader.inventory()
    reader.samples()
    time.sleep(0.3)  # GPM needs two samples > 100 ms apart
    samples = reader.samples()
    for g in inv["gpus"]:
        mine = [s for s in samples if s["gpu"] == g["uuid"]]
        if g["mig"]["enabled"]:
            with_ci = {i["start"] for i in g["mig"]["instances"] if i["uuid"]}
            assert {s["start"] for s in mine} == with_ci
        else:
            assert len(mine) == 1 and mine[0]["start"] is None
            assert mine[0]["util"] is not None and 0 <= mine[0]["util"] <= 100
        for s in mine:
            assert s["util"] is None or 0 <= s["util"] <= 100
            assert s["memory_used_mib"] >= 0


def test_mig_slices_have_mig_uuids_and_per_instance_memory(reader):
    migs = [g for g in reader.inventory()["gpus"] if g["mig"]["enabled"]]
    if not migs:
        pytest.skip("no GPU here has MIG enabled (this test never enables it)")
    for g in migs:
        for inst in g["mig"]["instances"]:
            if inst["uuid"]:
                h = pynvml.nvmlDeviceGetHandleByUUID(inst["uuid"])
                assert pynvml.nvmlDeviceIsMigDeviceHandle(h)
                assert pynvml.nvmlDeviceGetMemoryInfo(h).total < g["memory_mib"] * 1024 * 1024


def test_health_and_processes_do_not_crash(reader):
    health = reader.health()
    assert all(not h["lost"] for h in health)
    assert isinstance(reader.processes(), list)
