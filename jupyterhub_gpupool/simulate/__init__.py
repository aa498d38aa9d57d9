"""Trace replays that exercise the pool's placement on public cluster data."""
