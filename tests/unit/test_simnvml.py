"""The simulated NVML follows NVIDIA's rules and is deterministic."""

from __future__ import annotations

import ctypes

import pytest

from jupyterhub_gpupool.pool.errors import ConfigError
from jupyterhub_gpupool.telemetry import simnvml
from jupyterhub_gpupool.telemetry.simnvml import SimNvml
from tests.fakes import SecondsClock

POOL = """
simulation: {seed: 3}
nodes:
  - name: amp
    gpus:
      - model: A100-80GB
        mig: {enabled: true, instances: [{profile: 3g.40gb, start: 0}]}
        load: {instances: {0: {pattern: steady, level: 70}}}
      - {model: A100-80GB, load: {pattern: bursty, level: 90, period: 60, duty: 0.5}}
      - {model: T4, load: notebook}
  - name: hop
    gpus:
      - model: H100-80GB
        mig: {enabled: true, instances: [{profile: 3g.40gb, start: 4}]}
        load: {instances: {4: {pattern: steady, level: 50, jitter: 0}}}
      - {model: H100-80GB, load: {pattern: steady, level: 40, jitter: 0}}
"""


T0 = 1_000_000.0


@pytest.fixture
def clock() -> SecondsClock:
    """The simulated NVML's clock (seconds), at ``T0``: it moves only when the test moves it."""
    return SecondsClock(T0)


def machine(node: str, clock: SecondsClock, **kw) -> SimNvml:
    sim = SimNvml.from_yaml(POOL, node, clock=clock, **kw)
    sim.nvmlInit()
    return sim


def place(sim: SimNvml, start: int, size: int):
    return ctypes.byref(sim.c_nvmlGpuInstancePlacement_t(start, size))


def test_uninitialized_calls_fail(clock):
    sim = SimNvml.from_yaml(POOL, "amp", clock=clock)
    with pytest.raises(simnvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()
    sim.nvmlInit()
    assert sim.nvmlDeviceGetCount() == 3


def test_node_selection_and_unknown_node(clock):
    assert machine("hop", clock).nvmlDeviceGetCount() == 2
    with pytest.raises(ConfigError, match="no node 'nope'"):
        SimNvml.from_yaml(POOL, "nope", clock=clock)


def test_illegal_layout_in_yaml_is_rejected_by_the_parser():
    bad = "nodes: [{name: x, gpus: [{model: A100-80GB, mig: {enabled: true, instances: "
    with pytest.raises(ConfigError, match="cannot start"):
        SimNvml.from_yaml(bad + "[{profile: 3g.40gb, start: 2}]}}]}]")
    with pytest.raises(ConfigError, match="unknown GPU model"):
        SimNvml.from_yaml("nodes: [{name: x, gpus: [{model: Z999}]}]")
    with pytest.raises(ConfigError, match="unknown load pattern"):
        SimNvml.from_yaml("nodes: [{name: x, gpus: [{model: T4, load: spiky}]}]")


def test_names_and_uuids(clock):
    sim = machine("amp", clock)
    gpu = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceGetName(gpu) == "NVIDIA A100-SXM4-80GB"
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    assert sim.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    mig_uuid = sim.nvmlDeviceGetUUID(mig)
    assert mig_uuid.startswith("MIG-")
    assert sim.nvmlDeviceGetHandleByUUID(mig_uuid) == mig
    assert sim.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert sim.nvmlDeviceIsMigDeviceHandle(gpu).value == 0
    assert sim.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig) is gpu
    with pytest.raises(simnvml.NVMLError_NotFound):
        sim.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)
    with pytest.raises(simnvml.NVMLError_NotFound):
        sim.nvmlDeviceGetHandleByUUID("GPU-nope")


def test_profiles_and_placements_come_from_the_catalog(clock):
    sim = machine("amp", clock)
    gpu = sim.nvmlDeviceGetHandleByIndex(0)
    info = sim.nvmlDeviceGetGpuInstanceProfileInfo(gpu, simnvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
    assert (info.id, info.sliceCount, info.instanceCount, info.name) == (19, 1, 7, b"MIG 1g.10gb")
    rev2 = simnvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
    assert sim.nvmlDeviceGetGpuInstanceProfileInfo(gpu, rev2).id == 15
    with pytest.raises(simnvml.NVMLError_NotSupported):  # 6-slice profile: not on an A100
        sim.nvmlDeviceGetGpuInstanceProfileInfo(gpu, simnvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)
    with pytest.raises(simnvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetGpuInstanceProfileInfo(gpu, simnvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
    t4 = sim.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(simnvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetGpuInstanceProfileInfo(t4, 0)
    with pytest.raises(simnvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetMigMode(t4)
    count = ctypes.c_uint(0)
    sim.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, 14, None, ctypes.byref(count))
    array = (sim.c_nvmlGpuInstancePlacement_t * count.value)()
    sim.nvmlDeviceGetGpuInstancePossiblePlacements(gpu, 14, array, ctypes.byref(count))
    assert [(p.start, p.size) for p in array] == [(0, 2), (2, 2), (4, 2)]


def test_illegal_and_overlapping_placements_raise_insufficient_resources(clock):
    sim = machine("amp", clock)
    gpu = sim.nvmlDeviceGetHandleByIndex(0)  # 3g.40gb already at 0
    with pytest.raises(simnvml.NVMLError_InsufficientResources):
        sim.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 14, place(sim, 1, 2))  # misaligned
    with pytest.raises(simnvml.NVMLError_InsufficientResources):
        sim.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 14, place(sim, 2, 2))  # overlaps
    gi = sim.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, place(sim, 4, 4))
    assert sim.nvmlGpuInstanceGetInfo(gi).placement.start == 4
    with pytest.raises(simnvml.NVMLError_InsufficientResources):  # compute slices: 3+3+1 ok,
        sim.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 19, place(sim, 4, 1))  # memory not
    plain = sim.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(simnvml.NVMLError_NotSupported):  # MIG off
        sim.nvmlDeviceCreateGpuInstanceWithPlacement(plain, 19, place(sim, 0, 1))


def test_create_compute_instance_then_destroy_in_order(clock):
    sim = machine("amp", clock)
    gpu = sim.nvmlDeviceGetHandleByIndex(0)
    gi = sim.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 14, place(sim, 4, 2))
    ci_info = sim.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, simnvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE, 0
    )
    ci = sim.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
    with pytest.raises(simnvml.NVMLError_InsufficientResources):
        sim.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
    assert sim.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)
    assert sim.nvmlDeviceGetGpuInstanceId(mig) == sim.nvmlGpuInstanceGetInfo(gi).id
    pid = sim.add_process(sim.nvmlDeviceGetUUID(mig), used_mib=2048)
    assert [p.pid for p in sim.nvmlDeviceGetComputeRunningProcesses(mig)] == [pid]
    with pytest.raises(simnvml.NVMLError_InUse):
        sim.nvmlComputeInstanceDestroy(ci)
    with pytest.raises(simnvml.NVMLError_InUse):  # compute instances still exist
        sim.nvmlGpuInstanceDestroy(gi)
    sim.remove_process(pid)
    sim.nvmlComputeInstanceDestroy(ci)
    sim.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(simnvml.NVMLError_NotFound):
        sim.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)
    gi2 = sim.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 14, place(sim, 4, 2))  # slot free
    assert sim.nvmlGpuInstanceGetInfo(gi2).placement.start == 4


def test_mig_memory_is_per_instance(clock):
    sim = machine("amp", clock)
    gpu = sim.nvmlDeviceGetHandleByIndex(0)
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    mem = sim.nvmlDeviceGetMemoryInfo(mig)
    assert mem.total == 40 * 1024 * 1024 * 1024
    assert mem.used == int(0.5 * 40 * 1024) * 1024 * 1024  # steady pattern holds half


def test_utilization_not_supported_on_mig(clock):
    sim = machine("amp", clock)
    gpu = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(simnvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetUtilizationRates(gpu)
    with pytest.raises(simnvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetUtilizationRates(sim.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0))
    assert 0 <= sim.nvmlDeviceGetUtilizationRates(sim.nvmlDeviceGetHandleByIndex(1)).gpu <= 100


def gpm_pair(sim: SimNvml, clock: SecondsClock, gpu, gi_id: int, seconds: float) -> float:
    s1, s2 = sim.nvmlGpmSampleAlloc(), sim.nvmlGpmSampleAlloc()
    sim.nvmlGpmMigSampleGet(gpu, gi_id, s1)
    clock.now += seconds
    sim.nvmlGpmMigSampleGet(gpu, gi_id, s2)
    mg = sim.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = 1, 2, s1, s2
    mg.metrics[0].metricId = simnvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    mg.metrics[1].metricId = simnvml.NVML_GPM_METRIC_SM_UTIL
    sim.nvmlGpmMetricsGet(mg)
    assert mg.metrics[1].value < mg.metrics[0].value
    return mg.metrics[0].value


def test_gpm_only_on_hopper(clock):
    amp, hop = machine("amp", clock), machine("hop", clock)
    a100 = amp.nvmlDeviceGetHandleByIndex(0)
    assert amp.nvmlGpmQueryDeviceSupport(a100).isSupportedDevice == 0
    with pytest.raises(simnvml.NVMLError_NotSupported):
        amp.nvmlGpmMigSampleGet(a100, 1, amp.nvmlGpmSampleAlloc())
    h100 = hop.nvmlDeviceGetHandleByIndex(0)
    assert hop.nvmlGpmQueryDeviceSupport(h100).isSupportedDevice == 1
    gi_id = hop.nvmlDeviceGetGpuInstanceId(hop.nvmlDeviceGetMigDeviceHandleByIndex(h100, 0))
    assert gpm_pair(hop, clock, h100, gi_id, 30) == pytest.approx(50.0)


def test_gpm_samples_must_be_100ms_apart(clock):
    hop = machine("hop", clock)
    h100 = hop.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(simnvml.NVMLError_InvalidArgument):
        gpm_pair(hop, clock, h100, 1, 0.05)
    assert gpm_pair(hop, clock, h100, 1, 0.2) == pytest.approx(50.0)


def test_lost_gpu_raises_gpu_is_lost(clock):
    sim = machine("amp", clock)
    gpu = sim.nvmlDeviceGetHandleByIndex(1)
    sim.set_lost(sim.nvmlDeviceGetUUID(gpu))
    for call in (sim.nvmlDeviceGetUUID, sim.nvmlDeviceGetUtilizationRates):
        with pytest.raises(simnvml.NVMLError_GpuIsLost):
            call(gpu)
    with pytest.raises(simnvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetHandleByIndex(1)
    assert sim.nvmlDeviceGetCount() == 3


def test_missing_function_raises_function_not_found(clock):
    sim = machine("hop", clock)
    sim.remove_function("nvmlGpmQueryDeviceSupport")
    with pytest.raises(simnvml.NVMLError_FunctionNotFound):
        sim.nvmlGpmQueryDeviceSupport(sim.nvmlDeviceGetHandleByIndex(0))


def test_error_classes_behave_like_pynvml():
    err = simnvml.NVMLError(simnvml.NVML_ERROR_IN_USE)
    assert type(err) is simnvml.NVMLError_InUse and err.value == 19
    assert isinstance(simnvml.NVMLError_GpuIsLost(), simnvml.NVMLError)
    assert simnvml.NVMLError_GpuIsLost().value == 15


def series(pattern: dict, seed: int = 1, seconds: int = 600) -> list[float]:
    clock = SecondsClock(T0)
    gpus = f"[{{model: T4, load: {pattern}}}]"
    text = f"simulation: {{seed: {seed}}}\nnodes: [{{name: n, gpus: {gpus}}}]"
    sim = SimNvml.from_yaml(text, clock=clock)
    sim.nvmlInit()
    gpu = sim.nvmlDeviceGetHandleByIndex(0)
    out = []
    for _ in range(seconds // 10):
        out.append(sim.nvmlDeviceGetUtilizationRates(gpu).gpu)
        clock.now += 10
    return out


def test_load_patterns_are_deterministic_and_shaped():
    steady = series({"pattern": "steady", "level": 60})
    assert steady == series({"pattern": "steady", "level": 60})
    assert steady != series({"pattern": "steady", "level": 60}, seed=2)
    assert all(55 <= u <= 65 for u in steady)
    assert set(series({"pattern": "idle"})) == {0}
    bursty = series({"pattern": "bursty", "level": 90, "period": 100, "duty": 0.3})
    high = [u for u in bursty if u > 50]
    assert 0.2 < len(high) / len(bursty) < 0.4
    notebook = series({"pattern": "notebook", "level": 80, "train": 200})
    assert all(u > 70 for u in notebook[:20]) and set(notebook[21:]) == {0}


def test_notebook_keeps_memory_after_training(clock):
    text = "nodes: [{name: n, gpus: [{model: T4, load: {pattern: notebook, train: 60}}]}]"
    sim = SimNvml.from_yaml(text, clock=clock)
    sim.nvmlInit()
    gpu = sim.nvmlDeviceGetHandleByIndex(0)
    clock.now += 600
    assert sim.nvmlDeviceGetUtilizationRates(gpu).gpu == 0
    assert sim.nvmlDeviceGetMemoryInfo(gpu).used > 0


def test_module_level_interface(clock):
    sim = simnvml.configure(POOL, node="hop", clock=clock)
    assert sim is simnvml.machine()
    simnvml.nvmlInit()
    try:
        assert simnvml.nvmlDeviceGetCount() == 2
        h = simnvml.nvmlDeviceGetHandleByIndex(1)
        assert simnvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
    finally:
        simnvml.nvmlShutdown()
