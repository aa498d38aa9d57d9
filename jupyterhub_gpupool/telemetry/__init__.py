"""Telemetry from GPUs: the NVML reader the node agent uses, and a simulated NVML library.

``nvml.NvmlReader`` reads only through the pynvml function API, so it runs unchanged on top of
the real ``pynvml`` (package ``nvidia-ml-py``) or on ``simnvml``, which tests and the demo use.
"""
