"""Spawners that take their GPU from the pool (installed as ``jupyterhub_gpupool.spawner``).

- ``base.GPUPoolSpawnerMixin``: ask the pool, wait in its queue with progress, bind, release.
- ``local.GPUPoolLocalProcessSpawner`` (entry point ``gpupool-local``): pinned by CUDA env.
- ``kube.GPUPoolKubeSpawner`` (``gpupool-kube``): device-plugin resources and the pool's node.
- ``objects``: the pure Kubernetes fragments ``kube`` applies.
"""
