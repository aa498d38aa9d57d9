"""Exact device selection with Dynamic Resource Allocation: the CEL that names one device, and
the claim of a job's granted devices.

Shared by every object the pool makes with a ResourceClaim (a server's, ``spawner/dra.py``;
a job's, ``kube/kubejobs.py`` and ``kube/kueue.py``), so a device is selected one way. Facts
from NVIDIA's DRA driver (github.com/NVIDIA/k8s-dra-driver-gpu, now
kubernetes-sigs/dra-driver-nvidia-gpu, HEAD 2240711 of 2026-05-15; the full list is in
``spawner/dra.py``): DeviceClasses ``gpu.nvidia.com`` and ``mig.nvidia.com``; a GPU's
attribute ``uuid``; a MIG device's ``parentUUID`` and ``profile`` and one capacity
``memorySlice<i>`` per memory slice it occupies.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

API_VERSION = "resource.k8s.io/v1"
#: The driver's name: the domain of its attributes and capacities, and its config's driver.
DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"

_UNSAFE_CEL = re.compile(r"[\x00-\x1f\"\\]")


def _cel_string(value: object) -> str:
    """``value`` as a CEL string literal; quotes, backslashes and control characters are
    refused rather than escaped (no uuid or profile has them: a value that does is not one)."""
    if not isinstance(value, str) or not value or _UNSAFE_CEL.search(value):
        raise ValueError(f"{value!r} cannot be put in a device selector")
    return f'"{value}"'


def _attr(name: str) -> str:
    return f'device.attributes["{DRIVER}"].{name}'


def device_selector(slot: Mapping[str, Any], placed: bool = True) -> tuple[str, str]:
    """The DeviceClass and the CEL expression that select exactly the device of ``slot``.

    A whole GPU or a share: the GPU's ``uuid``. A MIG slice: the parent GPU's uuid, the profile
    and, where the pool knows the placement (and the driver publishes it as a capacity: not for
    the abstract devices of dynamic MIG, ``placed`` False), the memory slice at its ``start``
    (two slices of one profile on one GPU never share a memory slice).
    """
    kind = slot.get("kind")
    gpu = _cel_string(slot.get("gpu"))
    if kind in ("gpu", "shared"):
        return GPU_CLASS, f"{_attr('uuid')} == {gpu}"
    if kind != "mig":
        raise ValueError(f"slot kind {kind!r} has no DRA device")
    profile = _cel_string(slot.get("profile"))
    parts = [f"{_attr('parentUUID')} == {gpu}", f"{_attr('profile')} == {profile}"]
    start = slot.get("start") if placed else None
    if start is not None:
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise ValueError(f"MIG placement start {start!r} is not a memory slice")
        parts.append(f'"memorySlice{start}" in device.capacity["{DRIVER}"]')
    return MIG_CLASS, " && ".join(parts)


def exact_device(slot: Mapping[str, Any], placed: bool = True) -> dict[str, Any]:
    """A claim request's body selecting exactly one device: ``slot``'s (``device_selector``),
    for a server's claim and a job's alike."""
    device_class, expression = device_selector(slot, placed)
    return {
        "deviceClassName": device_class,
        "selectors": [{"cel": {"expression": expression}}],
        "allocationMode": "ExactCount",
        "count": 1,
    }


def devices_claim(
    slots: Iterable[Mapping[str, Any]], name: str, namespace: str, labels: Mapping[str, str]
) -> dict[str, Any]:
    """The ResourceClaim of a job's granted devices, as ``slots`` (``kind`` ``gpu`` or ``mig``,
    the ``gpu`` uuid, a MIG instance's ``profile`` and ``start``; ``kube.kueue.job_slots``):
    one request per device, each selecting exactly it. Raises ``ValueError`` for no device."""
    requests = [{"name": f"gpu-{i}", "exactly": exact_device(slot)} for i, slot in enumerate(slots)]
    if not requests:
        raise ValueError(f"claim {name}: no device to select")
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"devices": {"requests": requests}},
    }
