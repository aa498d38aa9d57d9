"""``GPUPoolKubeSpawner``: KubeSpawner pods on the node and device the pool granted.

The lease is taken in ``run_pre_spawn_hook`` (base mixin), before KubeSpawner's ``_start``;
KubeSpawner applies ``profile_list`` overrides in ``load_user_options()`` (inside ``start()``),
so the pool's fragments (``objects.pod_overrides``) are applied right *after* that — on top of
whatever a profile set, and with GPU resources of a CPU-only choice removed (the stale-override
bug of kubespawner#546). The offer comes from our picker (``user_options["gpupool_offer"]``) or,
where ``profile_list`` is configured, from the chosen profile's
``kubespawner_override: {gpupool_offer: ...}``; the profile form then shows each GPU profile's
live availability.

Where the cluster has Dynamic Resource Allocation and NVIDIA's DRA driver (``device_backend``,
``auto`` by default), the pod gets the exact device through a ResourceClaim (``spawner/dra.py``)
instead of a device-plugin resource; older clusters keep the device plugin unchanged.
"""

from __future__ import annotations

import copy
from typing import Any

from jupyterhub.utils import maybe_future
from kubernetes_asyncio.client import ApiException, CoreV1Api
from kubespawner import KubeSpawner
from traitlets import Bool, Dict, Enum, List, TraitError, Unicode, Union, validate

from jupyterhub_gpupool.poolclient import PoolRefused, PoolUnavailable
from jupyterhub_gpupool.wording import units_text

from . import clusterapi, dra, objects
from .base import GPUPoolSpawnerMixin, spawn_error
from .drakube import DeviceTaken, DRAClaims
from .picker import OPTION, wait_text


class GPUPoolKubeSpawner(DRAClaims, GPUPoolSpawnerMixin, KubeSpawner):  # type: ignore[misc]  # kubespawner ships no type information
    """KubeSpawner with GPUs from the pool (zero-to-jupyterhub: ``hub.config``)."""

    extra_pod_config: dict[str, Any]  # KubeSpawner's trait (annotation only)

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

    cluster_apis = Dict(
        help="How to reach the Kubernetes API of each pool cluster this hub launches into "
        "(see pool_clusters): {cluster: {context, config_file}} for a kube config context, or "
        "{cluster: {host, ssl_ca_cert, token_file | token, verify_ssl}}. A lease's pod is "
        "created, watched and deleted through its cluster's API; a cluster not listed uses "
        "KubeSpawner's own (in-cluster, or k8s_api_host).",
    ).tag(config=True)

    flat_network = Bool(
        False,
        help="Declare that this hub may launch into the other clusters of cluster_apis: their "
        "pods reach the hub (hub_connect_url, routable from there) and the hub's proxy "
        "reaches their pod IPs (one flat network, or routes between the clusters' pod "
        "networks). Without it cluster_apis is refused when the config loads; the supported "
        "topology is one hub per cluster sharing one pool (docs: multi-cluster how-to).",
    ).tag(config=True)

    runtime_class_name = Unicode(
        "",
        help="RuntimeClass of GPU pods (runtimeClassName), e.g. nvidia where the GPU Operator's "
        "NVIDIA runtime is not the nodes' default; CPU-only pods do not get it. Empty: none.",
    ).tag(config=True)

    @validate("cluster_apis")
    def _valid_cluster_apis(self, proposal: dict[str, Any]) -> dict[str, Any]:
        if proposal["value"] and not self.flat_network:
            raise TraitError(
                "cluster_apis: a hub that launches servers into other clusters "
                f"({', '.join(sorted(proposal['value']))}) needs a flat network: their pods "
                "must reach this hub (hub_connect_url) and its proxy their pod IPs; declare it "
                "with GPUPoolKubeSpawner.flat_network = True, or run one hub per cluster "
                "sharing one pool (docs: multi-cluster how-to)"
            )
        try:
            return clusterapi.check_settings(proposal["value"])
        except clusterapi.ClusterAPIError as e:
            raise TraitError(str(e)) from None

    # -- which cluster ----------------------------------------------------------------------

    _gpupool_api_cluster: str | None = None

    def lease_cluster(self) -> str | None:
        """The cluster of the lease when this hub has settings for its API (None: the
        default API, KubeSpawner's own)."""
        cluster = (self.gpupool_lease or {}).get("cluster")
        return cluster if cluster in self.cluster_apis else None

    async def use_cluster_api(self) -> None:
        """Point ``self.api`` (and so the pod calls) at the lease's cluster."""
        cluster = self.lease_cluster()
        if cluster == self._gpupool_api_cluster:
            return
        if cluster is None:
            from kubespawner.clients import shared_client

            self.api = shared_client("CoreV1Api")
        else:
            try:
                client = await clusterapi.api_client(cluster, self.cluster_apis[cluster])
            except Exception as e:  # a context or file that does not work: say which
                self.log.error("Kubernetes API of cluster %s: %s", cluster, e)
                raise spawn_error(
                    f"The Kubernetes API of cluster {cluster} is not reachable with this hub's "
                    f"settings ({type(e).__name__}: {e}); ask an administrator.",
                    reason="gpupool_cluster_api",
                    status=503,
                ) from e
            self.api = CoreV1Api(client)
        self._gpupool_api_cluster = cluster

    def _get_reflector_key(self, kind: str) -> tuple[Any, ...]:
        """KubeSpawner's key, plus the cluster when it is not the default API."""
        key: tuple[Any, ...] = super()._get_reflector_key(kind)
        cluster = self._gpupool_api_cluster
        return key if cluster is None else (*key, cluster)

    async def _start_reflector(
        self, kind: str, reflector_class: type, *args: Any, **kw: Any
    ) -> Any:
        """Reflectors of another cluster list and watch through that cluster's API."""
        if self._gpupool_api_cluster is not None:
            reflector_class = clusterapi.bound_reflector(reflector_class, self.api)
        return await super()._start_reflector(kind, reflector_class, *args, **kw)

    async def poll(self) -> int | None:
        """Poll the pod in its cluster."""
        await self.use_cluster_api()
        return await super().poll()

    async def stop(self, now: bool = False) -> None:
        """Delete the pod in its cluster, then its claim (DRA)."""
        await self.use_cluster_api()
        try:
            return await super().stop(now)
        finally:
            await self.dra_delete()

    def get_state(self) -> dict[str, Any]:
        """Adds the DRA claim (to delete it with the server after a hub restart)."""
        state: dict[str, Any] = super().get_state()
        mine = self.dra_state()
        if mine:
            state["gpupool_dra"] = mine
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.dra_load(state.get("gpupool_dra"))

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
        if self.gpupool_lease and self.gpupool_lease.get("slots") and self.dra_in_use():
            # the claim gives the device: no device-plugin resource beside it
            limits, guarantees = objects.strip_gpu_resources(
                overrides["extra_resource_limits"], overrides["extra_resource_guarantees"]
            )
            overrides.update(extra_resource_limits=limits, extra_resource_guarantees=guarantees)
        for name, value in overrides.items():
            setattr(self, name, value)
        gpu = bool(self.gpupool_lease and self.gpupool_lease.get("slots"))
        self.extra_pod_config = objects.with_runtime_class(
            self.extra_pod_config, self.runtime_class_name, gpu=gpu
        )

    async def get_pod_manifest(self) -> Any:
        """KubeSpawner's pod; with DRA, the lease's claims made and referenced from it."""
        pod = await super().get_pod_manifest()
        lease = self.gpupool_lease
        if lease and lease.get("slots") and self.dra_in_use():
            try:
                refs = await self.dra_prepare(lease, self.namespace, self.pod_name)
            except ValueError as e:  # a lease the claim cannot express: say which
                raise spawn_error(
                    f"GPU lease {lease.get('id')} cannot be requested through DRA: {e}",
                    reason="gpupool_dra_claim",
                    status=500,
                ) from e
            except ApiException as e:
                if e.status != 404:
                    raise
                where = self._gpupool_api_cluster or "of this hub"
                raise spawn_error(
                    f"The Kubernetes API of cluster {where} serves no ResourceClaims "
                    "(resource.k8s.io/v1), but device_backend is 'dra'; ask an administrator "
                    "(device_backend 'auto' or 'device-plugin').",
                    reason="gpupool_dra_missing",
                    status=503,
                ) from e
            dra.attach_claims(pod, refs)
        return pod

    async def start(self) -> Any:
        """Create the pod on the granted node (through its cluster's API), then bind."""
        await self.use_cluster_api()
        lease = self.gpupool_lease
        self._dra_backend_now = None
        try:
            if lease and lease.get("slots"):
                await self.dra_backend(self._gpupool_api_cluster)
            url = await super().start()
        except ApiException as e:
            await self._forget_claims()
            cluster = self._gpupool_api_cluster
            if cluster is None or e.status not in (401, 403):
                raise
            self.log.error("Kubernetes API of cluster %s refused the hub: %s", cluster, e)
            raise spawn_error(
                f"The Kubernetes API of cluster {cluster} refused this hub's credentials "
                f"({e.status} {e.reason}); ask an administrator.",
                reason="gpupool_cluster_api",
                status=503,
            ) from e
        except BaseException:
            await self._forget_claims()
            raise
        if lease and self.dra_in_use():
            try:
                await self.dra_record(lease, self.namespace)
            except ApiException as e:  # the pod runs on the claim's device either way
                self.log.error("Reading the DRA allocation of lease %s: %s", lease["id"], e)
            except DeviceTaken as e:  # pod and claim go, the lease is given back
                self.log.error("Lease %s: %s", lease["id"], e)
                await self.stop(now=True)
                raise spawn_error(str(e), reason="gpupool_dra_device_held", status=409) from e
        await self.bind_lease(url)
        return url

    async def _forget_claims(self) -> None:
        """A failed start deletes the server claim (the hub's stop may come later, or not)."""
        try:
            await self.dra_delete()
        except Exception as e:
            self.log.error("Deleting the DRA claim of %s: %s", self._log_name, e)

    # -- the form -----------------------------------------------------------------------------

    def _options_from_form(self, formdata: dict[str, Any]) -> dict[str, Any]:
        """KubeSpawner keeps only profile fields; keep the picker's choice too."""
        options: dict[str, Any] = super()._options_from_form(formdata)
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
        missing = [n for n in map(self._profile_offer, profiles) if n and n not in by_name]
        elsewhere = await self._offers_elsewhere() if missing and not choices["error"] else {}
        annotated = []
        for profile in copy.deepcopy(profiles):
            offer = self._profile_offer(profile)
            if offer:
                o = by_name.get(offer)
                if o is None and offer in elsewhere:
                    where = ", ".join(elsewhere[offer])
                    note = (
                        f"unavailable: runs only in cluster {where}, where this hub does not launch"
                    )
                elif o is None:
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
        form: str = self._render_options_form(annotated)
        return form

    async def _offers_elsewhere(self) -> dict[str, list[str]]:
        """Offers the user may have in clusters other than this hub's ``pool_clusters``, with
        the clusters they are kept to: a profile of one says where it runs instead of
        "not available to you". Empty when the hub launches anywhere or the pool won't say."""
        if not self.pool_clusters:
            return {}
        try:
            offers = await self.pool.offers(self.user.name, self.user_groups, [])
        except (PoolUnavailable, PoolRefused):
            return {}
        mine = set(self.pool_clusters)
        return {
            o["name"]: sorted(o["clusters"])
            for o in offers
            if o.get("clusters") and not mine & set(o["clusters"])
        }


def _tolerations(value: Any) -> list[dict[str, Any]]:
    return list(value.values()) if isinstance(value, dict) else list(value)
