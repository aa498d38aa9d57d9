"""Kubernetes: the API server's nodes as the pool sees them, and MIG through mig-manager.

``client`` is the interface to the API server (plain HTTP, the JSON Kubernetes speaks);
``nodes`` reads gpu-feature-discovery's labels and the device plugin's allocatable (pure);
``labeller`` re-partitions Kubernetes nodes through the ``nvidia.com/mig.config`` label.
"""
