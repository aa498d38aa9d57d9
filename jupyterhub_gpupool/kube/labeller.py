"""Re-partition Kubernetes nodes through mig-manager's ``nvidia.com/mig.config`` label.

The store owns the re-partition (``store/operate.py``): it cordons the GPU in the pool, waits
until no lease holds what must go, then marks it ``applying`` with ``method: label``. From
there this labeller, run by the service's housekeeping on the leader only, drives each node:

1. **label**: the node's GPUs' wanted layouts (the re-partitioned ones, and the others as they
   are) must be one mig-parted config (``configs``: name → instances per GPU); the labeller sets
   ``nvidia.com/mig.config=<name>`` and removes ``nvidia.com/mig.config.state`` in the same
   merge patch, so a ``success`` read later is mig-manager's answer to *this* change, never the
   last one's;
2. **wait** while the state is absent, ``pending`` or ``rebooting``;
3. ``success``: once the device plugin advertises the new slices (``nvidia.com/mig-<profile>``
   in ``allocatable``), the new layout becomes the node's inventory; the store then closes the
   re-partition ``done`` and lifts the cordon (its agent, if it has one, reports the instances'
   UUIDs as usual);
4. ``failed``: the re-partition is closed ``failed`` with the node's message (its latest
   warning event), shown by ``GET repartitions``; the GPU gets its old cordon back.

A refusal of the API server (401, 403: the service account lacks a right) ends the
re-partition ``failed`` too, with the server's own words (which verb on which resource), rather
than being taken for an API server that is away and retried forever; the chart grants exactly
``get``/``patch`` on nodes and ``list`` on events with ``mig.repartition.enabled``. Nodes of
other clusters (``cluster_apis``) go through their cluster's API server.

Every step is read again from the API server each round, so a restarted (or newly elected)
service carries on where the last one was.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from traitlets import Bool, Dict, List, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable

from ..pool import commands
from ..pool.commands import Command
from ..pool.dramig import NO_REPARTITION, made_by_claim
from ..pool.model import Node
from ..store.read.repartitions import RepartitionView
from . import nodes as kn
from .client import KubeAPI, KubeClient, KubeError
from .settings import api_traits, make_client

log = logging.getLogger("jupyterhub_gpupool.kube")

#: The service's ``writer.run``: runs a pool command (``pool/commands.py``).
Call = Callable[[Command], Awaitable[Any]]


class MigLabeller(LoggingConfigurable):
    """The ``nvidia.com/mig.config`` writer (``c.MigLabeller`` in the service's config)."""

    enabled = Bool(
        False,
        help="Re-partition Kubernetes nodes' MIG GPUs through the GPU Operator's mig-manager "
        "(the nvidia.com/mig.config label). Needs the right to patch nodes (the Helm chart's "
        "mig.repartition.enabled grants it and sets this).",
    ).tag(config=True)
    api_host, token_file, ca_file = api_traits()
    configs = Dict(
        help="mig-parted configs the nodes' mig-manager knows, as name → instances per GPU by "
        "profile, e.g. {'all-1g.10gb': {'1g.10gb': 7}, 'half-3g': {'3g.40gb': 1, '1g.10gb': 3}}. "
        "Merged over mig-parted's all-disabled and all-<profile> configs for the catalog's "
        "models.",
    ).tag(config=True)

    dra_dynamic_mig = List(
        Unicode(),
        help="Clusters (every node of the cluster) or nodes where NVIDIA's DRA driver runs with "
        "its DynamicMIG feature gate: it makes a MIG instance when a claim for the profile on "
        "the GPU is allocated and destroys it with the claim. Their MIG-mode GPUs are dynamic "
        "for the pool, a MIG grant there is ready at once (the server's claim makes the "
        "instance: no agent plan, no nvidia.com/mig.config label), and re-partitioning any GPU "
        "of their nodes is refused (this labeller fails one asked before). E.g. ['default'].",
    ).tag(config=True)

    cluster_apis = Dict(
        help="The API servers of the pool's other clusters, for re-partitioning their nodes: "
        "{cluster: {host, token_file, ca_file}}, e.g. {'us': {'host': 'https://10.1.0.1:6443', "
        "'token_file': '/etc/us/token', 'ca_file': '/etc/us/ca.crt'}}. The token needs get "
        "and patch on nodes and list on events in that cluster (docs: multi-cluster how-to, "
        "the cross-cluster ClusterRole). A cluster not listed uses api_host.",
    ).tag(config=True)

    @validate("cluster_apis")
    def _valid_cluster_apis(self, proposal: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for cluster, raw in proposal["value"].items():
            if not isinstance(raw, Mapping) or not raw.get("host"):
                raise TraitError(f"MigLabeller.cluster_apis[{cluster!r}] needs a host")
            unknown = set(raw) - CLUSTER_API_KEYS
            if unknown:
                raise TraitError(
                    f"MigLabeller.cluster_apis[{cluster!r}]: unknown key(s) "
                    f"{', '.join(sorted(unknown))} (known: {', '.join(sorted(CLUSTER_API_KEYS))})"
                )
            out[str(cluster)] = dict(raw)
        return out

    _client: KubeClient | None = None
    _cluster_clients: dict[str, KubeClient] | None = None

    def client(self, cluster: str | None = None) -> KubeClient:
        """The API client of ``cluster`` (its ``cluster_apis`` entry, else the default one),
        built on first use: no I/O in the constructor."""
        if cluster is not None and cluster in self.cluster_apis:
            if self._cluster_clients is None:
                self._cluster_clients = {}
            if cluster not in self._cluster_clients:
                raw = self.cluster_apis[cluster]
                api = KubeAPI(
                    raw["host"],
                    token_file=raw.get("token_file", ""),
                    ca_file=raw.get("ca_file", ""),
                )
                self._cluster_clients[cluster] = KubeClient(api)
            return self._cluster_clients[cluster]
        if self._client is None:
            self._client = make_client(self.api_host, self.token_file, self.ca_file)
        return self._client

    async def close(self) -> None:
        """Close every API client (the service's shutdown, tests)."""
        clients = [self._client, *(self._cluster_clients or {}).values()]
        self._client, self._cluster_clients = None, None
        for c in clients:
            if c is not None:
                await c.close()

    def all_configs(self, store: Any) -> dict[str, dict[str, int]]:
        """The configs a node may be labelled with."""
        return {**kn.default_configs(store.catalog), **dict(self.configs)}

    async def step(self, store: Any, call: Call) -> dict[str, str]:
        """One round over the ``applying`` label re-partitions; ``call`` runs a command
        through the service's writer. Returns what happened per node (for logs and tests)."""
        reps = [r for r in store.repartitions(state="applying") if r.method == "label"]
        by_node: dict[str, list[RepartitionView]] = {}
        for rep in reps:
            by_node.setdefault(rep.node, []).append(rep)
        out = {}
        for node, node_reps in by_node.items():
            try:
                out[node] = await self._node(store, call, node, node_reps)
            except KubeError as e:
                if e.status == 404:
                    why = f"node {node} is not a node of the Kubernetes API the pool watches"
                    await self._fail(call, node_reps, why)
                    out[node] = "failed"
                elif e.status in REFUSED:  # a missing right never comes by waiting
                    log.error("Kubernetes API refused re-partitioning node %s: %s", node, e)
                    await self._fail(call, node_reps, refused_message(node, e))
                    out[node] = "failed"
                else:  # the API server is away: try again next round
                    log.warning("Kubernetes API for node %s: %s", node, e)
                    out[node] = "unreachable"
        if any(v == "done" for v in out.values()):
            await call(commands.AdvanceRepartitions())
        return out

    async def _fail(self, call: Call, reps: list[RepartitionView], why: str) -> None:
        for rep in reps:
            await call(commands.FailRepartition(rep.id, why, actor="kube"))

    def _wanted(self, store: Any, node: str, reps: list[RepartitionView]) -> Node | None:
        """The node as it will be: the re-partitioned GPUs in their new layout, the rest as
        they are (copies: the allocator's own values are never touched)."""
        layouts = {r.gpu: [(i.profile, i.start) for i in r.layout] for r in reps}
        wanted: Node | None = store.repartitioned_node(node, layouts)
        return wanted

    async def _node(self, store: Any, call: Call, name: str, reps: list[RepartitionView]) -> str:
        wanted = self._wanted(store, name, reps)
        if wanted is None:
            await self._fail(call, reps, f"node {name} left the pool")
            return "failed"
        if made_by_claim(name, wanted.cluster, True, self.dra_dynamic_mig):
            # the DRA driver makes this node's MIG instances per claim: no label, ever (a
            # re-partition asked before the node was declared so ends here)
            await self._fail(call, reps, NO_REPARTITION.format(gpu=reps[0].gpu, node=name))
            return "failed"
        per_gpu = [kn.layout_counts((i.profile, i.start) for i in g.instances) for g in wanted.gpus]
        configs = self.all_configs(store)
        names = {kn.config_for(c, configs) for c in per_gpu}
        if len(names) != 1 or None in names:
            shown = "; ".join(
                ", ".join(f"{n}×{p}" for p, n in c.items()) or "MIG off" for c in per_gpu
            )
            await self._fail(
                call,
                reps,
                f"no mig-parted config gives node {name} the layout {shown} on every GPU: add "
                "one to mig-manager's ConfigMap and to MigLabeller.configs",
            )
            return "failed"
        config = names.pop()
        assert config is not None
        client = self.client(wanted.cluster)
        node = await client.get_node(name)
        have = kn.labels(node)
        if have.get(kn.MIG_CONFIG) != config:
            await client.patch_labels(name, {kn.MIG_CONFIG: config, kn.MIG_STATE: None})
            log.info(
                "Node %s: %s=%s (was %s)", name, kn.MIG_CONFIG, config, have.get(kn.MIG_CONFIG)
            )
            return "labelled"
        state = have.get(kn.MIG_STATE)
        if state is None or state in kn.IN_PROGRESS:
            return state or "waiting"
        if state == "failed":
            try:
                events = await client.node_events(name)
            except KubeError as e:
                if e.status not in REFUSED:
                    raise
                # mig-manager's verdict is known; only its words are missing: say why
                log.error("Kubernetes API refused the events of node %s: %s", name, e)
                message = kn.failure_message(name, config, [])
                await self._fail(call, reps, f"{message} (its events: {refused_message(name, e)})")
                return "failed"
            await self._fail(call, reps, kn.failure_message(name, config, events))
            return "failed"
        if state != "success":
            return "waiting"
        expected: dict[str, int] = {}
        for counts in per_gpu:
            for profile, n in counts.items():
                key = kn.resource_profile(profile)
                expected[key] = expected.get(key, 0) + n
        if kn.slice_counts(node) != expected:
            return "advertising"  # the device plugin restarts after mig-manager: not yet
        await call(commands.PutInventory(wanted, actor="kube"))
        return "done"


#: The keys of a ``cluster_apis`` entry.
CLUSTER_API_KEYS = frozenset({"host", "token_file", "ca_file"})
#: Statuses that mean the service account lacks a right (or a valid token), not an outage.
REFUSED = (401, 403)


def refused_message(node: str, error: KubeError) -> str:
    """A re-partition's error for a refusal: the server's words and the rights it needs."""
    return (
        f"the Kubernetes API refused the pool's service account for node {node} ({error}); "
        "re-partitioning needs get and patch on nodes and list on events (the Helm chart's "
        "mig.repartition.enabled grants exactly these)"
    )


def summary(result: Mapping[str, str]) -> str:
    """A log line of one round."""
    return ", ".join(f"{n}: {s}" for n, s in sorted(result.items()))
