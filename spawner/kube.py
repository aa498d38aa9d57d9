"""``GPUPoolKubeSpawner``: KubeSpawner pods on the node and device the pool granted.

The lease is taken in ``run_pre_spawn_hook`` (base mixin), before KubeSpawner's ``_start``;
KubeSpawner applies ``profile_list`` overrides in ``load_user_options()`` (inside ``start()``),
so the pool's fragments (``objects.pod_overrides``) are applied right *after* that — on top of
whatever a profile set, and with GPU resources of a CPU-only choice removed (the stale-override
bug of kubespawner#546). The offer comes from our picker (``user_options["gpupool_offer"]``) or,
where ``profile_list`` is configured, from the chosen profile's
``kubespawner_override: {gpupool_offer: ...}``; the profile form then shows each GPU profile's
live availability.
"""

from __future__ import annotations

import copy
from typing import Any

from jupyterhub.utils import maybe_future
from kubespawner import KubeSpawner
from traitlets import Dict, Enum, List, Unicode, Union

from jupyterhub_gpupool.wording import units_text

from . import objects
from .base import OPTION, GPUPoolSpawnerMixin, wait_text


class GPUPoolKubeSpawner(GPUPoolSpawnerMixin, KubeSpawner):
    """KubeSpawner with GPUs from the pool (zero-to-jupyterhub: ``hub.config``)."""

    gpupool_offer = Unicode(
        None,
        allow_none=True,
        help="The pool offer of a profile: set it in a profile_list entry's "
        "kubespawner_override ({gpupool_offer: a100-1g}); a profile without one is CPU-only.",
    ).tag(config=True)

    mig_strategy = Enum(
        objects.MIG_STRATEGIES,
        default_value="mixed",
        help="The NVIDIA device plugin's MIG strategy on your nodes: mixed (a MIG slice is "
        "nvidia.com/mig-<profile>), single (nvidia.com/gpu), or none (no MIG). It decides the "
        "extended resource a pod asks for, so it must match the plugin's, and a typo fails "
        "when the config loads rather than at the first spawn.",
    ).tag(config=True)

    node_label = Unicode(
        "kubernetes.io/hostname",
        allow_none=True,
        help="Node label whose value is the pool's node name; the pod's node_selector pins it. "
        "None pins by metadata.name in the required node affinity instead.",
    ).tag(config=True)

    gpu_tolerations = Union(
        [List(Dict()), Dict()],
        default_value=[dict(t) for t in objects.DEFAULT_GPU_TOLERATIONS],
        help="Tolerations added to GPU pods (and removed from CPU-only ones).",
    ).tag(config=True)

    shared_resource = Unicode(
        objects.DEFAULT_SHARED_RESOURCE,
        help="Extended resource of a time-sliced GPU share (the device plugin's "
        "renameByDefault: nvidia.com/gpu.shared).",
    ).tag(config=True)

    mig_resource_names = Dict(
        help="Map of catalog MIG profile → device-plugin resource name, where the plugin "
        "names a profile differently from the catalog (rare; see the Kubernetes how-to).",
    ).tag(config=True)

    # -- which offer ------------------------------------------------------------------------

    async def _profiles(self) -> list[dict[str, Any]]:
        profiles = self.profile_list
        if callable(profiles):
            profiles = await maybe_future(profiles(self))
        return self._sorted_dict_values(profiles) if profiles else []

    @staticmethod
    def _profile_offer(profile: dict[str, Any]) -> str | None:
        return (profile.get("kubespawner_override") or {}).get("gpupool_offer")

    async def resolve_offer(self) -> str:
        """The picker's choice, else the chosen profile's ``gpupool_offer``."""
        if (self.user_options or {}).get(OPTION) is not None:
            return self.chosen_offer()
        profiles = await self._profiles()
        if not profiles:
            return self.chosen_offer()
        slug = (self.user_options or {}).get("profile")
        if isinstance(slug, list):
            slug = slug[0] if slug else None
        try:
            profile = self._get_profile(slug, self._get_initialized_profile_list(profiles))
        except (ValueError, StopIteration):
            return self.chosen_offer()
        return self._profile_offer(profile) or ""

    # -- applying the lease -----------------------------------------------------------------

    def _current(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in objects.OVERRIDDEN_TRAITS}

    async def load_user_options(self) -> None:
        """Profiles first (KubeSpawner), then the pool's fragments on top."""
        await super().load_user_options()
        api_url = self.server_pool_api_url or self._pool_url()
        if self.gpupool_lease and self.gpupool_lease.get("slots"):
            overrides = objects.pod_overrides(
                self.gpupool_lease,
                api_url=api_url,
                current=self._current(),
                node_label=self.node_label,
                gpu_tolerations=_tolerations(self.gpu_tolerations),
                mig_strategy=self.mig_strategy,
                shared_resource=self.shared_resource,
                mig_resource_names=self.mig_resource_names or None,
            )
        else:
            overrides = objects.cpu_only_overrides(
                current=self._current(),
                api_url=api_url,
                gpu_tolerations=_tolerations(self.gpu_tolerations),
                shared_resource=self.shared_resource,
            )
        for name, value in overrides.items():
            setattr(self, name, value)

    async def start(self) -> Any:
        """Create the pod on the granted node, then bind the lease."""
        url = await super().start()
        await self.bind_lease()
        return url

    # -- the form -----------------------------------------------------------------------------

    def _options_from_form(self, formdata: dict) -> dict:
        """KubeSpawner keeps only profile fields; keep the picker's choice too."""
        options = super()._options_from_form(formdata)
        if OPTION in formdata:
            value = formdata[OPTION]
            options[OPTION] = value[0] if isinstance(value, list) and value else value
        return options

    async def get_options_form(self) -> str:
        """With ``profile_list``: KubeSpawner's form, GPU profiles annotated with live
        availability and cost; without: the pool's own picker."""
        profiles = await self._profiles()
        if not profiles:
            return await self.render_picker()
        choices = await self.gpupool_choices(with_quota=False)
        by_name = {o["name"]: o for o in choices["offers"]}
        annotated = []
        for profile in copy.deepcopy(profiles):
            offer = self._profile_offer(profile)
            if offer:
                o = by_name.get(offer)
                if o is None:
                    note = choices["error"] or "not available to you"
                elif not o["selectable"]:
                    note = f"unavailable: {o['why_not']}"
                elif o["available"] > 0:
                    note = f"{o['available']} free now · costs {units_text(o['units'])}"
                else:
                    note = (
                        f"none free: {o['queue_length']} waiting, {wait_text(o['eta_seconds'])}"
                        f" · costs {units_text(o['units'])}"
                    )
                profile["description"] = f"{profile.get('description', '')} — {note}".lstrip(" —")
            annotated.append(profile)
        return self._render_options_form(annotated)


def _tolerations(value: Any) -> list[dict[str, Any]]:
    return list(value.values()) if isinstance(value, dict) else list(value)
