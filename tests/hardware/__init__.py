"""Checks against real NVIDIA GPUs (skipped where NVML finds none)."""
