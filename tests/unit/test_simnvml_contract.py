"""The simulated NVML keeps pynvml's contract: names, parameters, constants, exceptions."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from jupyterhub_gpupool.telemetry import simnvml
from jupyterhub_gpupool.telemetry.simnvml import SimNvml

pynvml = pytest.importorskip(
    "pynvml", reason="nvidia-ml-py (pynvml) is not installed: pip install nvidia-ml-py"
)

FUNCTIONS = sorted(n for n in dir(simnvml) if n.startswith("nvml"))
CONSTANTS = sorted(n for n in dir(simnvml) if n.startswith("NVML_"))
ERRORS = sorted(n for n in dir(simnvml) if n.startswith("NVMLError_"))
STRUCTS = sorted(n for n in dir(simnvml) if n.startswith("c_nvml"))


def test_the_subset_is_substantial():
    assert len(FUNCTIONS) >= 40 and len(ERRORS) >= 15 and len(CONSTANTS) >= 50


def params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_exists_with_same_parameters(name):
    assert hasattr(pynvml, name), f"{name} is not a pynvml function"
    expected = params(getattr(pynvml, name))
    assert params(getattr(simnvml, name)) == expected
    assert params(getattr(SimNvml(), name)) == expected


@pytest.mark.parametrize("name", CONSTANTS)
def test_constant_has_pynvml_value(name):
    assert getattr(simnvml, name) == getattr(pynvml, name)


@pytest.mark.parametrize("name", ERRORS)
def test_exception_class_has_pynvml_name_and_code(name):
    ours, theirs = getattr(simnvml, name), getattr(pynvml, name)
    assert ours().value == theirs().value
    assert type(simnvml.NVMLError(ours().value)).__name__ == name


@pytest.mark.parametrize("name", STRUCTS)
def test_structures_have_pynvml_fields(name):
    ours, theirs = getattr(simnvml, name), getattr(pynvml, name)
    if hasattr(ours, "_fields_"):
        ours_fields = [f[0] for f in ours._fields_]
    elif dataclasses.is_dataclass(ours):
        ours_fields = [f.name for f in dataclasses.fields(ours)]
    else:
        ours_fields = [k for k in vars(ours()) if not k.startswith("_")]
        if name == "c_nvmlGpmSample_t":  # opaque in NVML: no fields to compare
            return
    if not hasattr(theirs, "_fields_"):  # handle (pointer) types: nothing to compare
        return
    theirs_fields = [f[0] for f in theirs._fields_]
    assert set(ours_fields) <= set(theirs_fields), set(ours_fields) - set(theirs_fields)


def test_machine_carries_the_same_constants_and_classes():
    sim = SimNvml()
    assert sim.NVMLError is simnvml.NVMLError
    assert sim.NVML_DEVICE_MIG_ENABLE == pynvml.NVML_DEVICE_MIG_ENABLE
    assert sim.c_nvmlGpuInstancePlacement_t is simnvml.c_nvmlGpuInstancePlacement_t
