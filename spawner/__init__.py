"""Spawners that ask the pool for a GPU slice (installed as ``jupyterhub_gpupool.spawner``).

The spawner classes arrive with the spawner issue; this package exists now so the packaging
layout (``spawner/`` mapped to ``jupyterhub_gpupool.spawner``) is fixed and tested from day one.
"""
