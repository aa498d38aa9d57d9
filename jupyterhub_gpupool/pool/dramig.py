"""MIG made per claim by NVIDIA's DRA driver (its ``DynamicMIG`` feature gate).

With ``DynamicMIG`` the driver publishes each MIG-mode GPU as *partitionable* (Kubernetes
KEP-4815): one counter set per GPU (its memory, multiprocessors, engines and one counter per
memory slice) and, for every profile and placement, an abstract MIG device consuming from it
(``cmd/gpu-kubelet-plugin/partitions.go``). The scheduler allocates a claim for "profile P on
parent GPU G" to a device whose counters are still free, and the driver creates the instance
when the pod's claim is prepared and destroys it when the claim goes. The driver destroys MIG
instances it did not make, and NVIDIA says not to run mig-parted (mig-manager) beside it
(``site/content/docs/guides/gpu-allocation/mig.md``). So on such a GPU:

* placement creates instances on free memory slices, as for any dynamic GPU;
* a grant is ready at once: the server's claim makes the instance (no agent plan, no label);
* the pool never re-partitions it (nor any GPU of its node) through ``nvidia.com/mig.config``,
  and the node agent never creates or destroys its instances.

Which GPUs: the MIG-mode GPUs of the clusters or nodes named in
``MigLabeller.dra_dynamic_mig``.
"""

from __future__ import annotations

from collections.abc import Collection

#: A re-partition refused on such a GPU (``{gpu}``, ``{node}``).
NO_REPARTITION = (
    "GPU {gpu}: node {node} has its MIG instances made per claim by the NVIDIA DRA driver "
    "(DynamicMIG, MigLabeller.dra_dynamic_mig): there is no layout to re-partition, each "
    "grant's claim makes its instance, and mig-manager must not change the node's GPUs "
    "beside the driver"
)


def made_by_claim(node: str, cluster: str, mig_enabled: bool, where: Collection[str]) -> bool:
    """Whether a GPU's MIG instances are the DRA driver's: in MIG mode, on a node or in a
    cluster named in ``where``."""
    return mig_enabled and (node in where or cluster in where)
