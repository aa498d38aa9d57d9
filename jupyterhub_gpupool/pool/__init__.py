"""The pure domain of the pool: catalog, inventory, placement, quotas, queue, allocator.

Nothing here does I/O or imports tornado, SQLAlchemy or pynvml: decisions are values that the
service's store turns into rows. All time comes in as arguments (an injectable clock upstream).
"""
