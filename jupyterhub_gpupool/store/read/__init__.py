"""Read models: typed, frozen views of what the pool holds (a lease, a job, a kernel, a node,
a reclaim policy, a re-partition, a quota, a lab's presence report, a user's page, the
inventory and the admin panel's map and tables; the usage and cost report, capacity planning's
days, a budget warning; the reclaimer's and the notices' answers, a job's log, a MIG plan; the
metrics' gauges and the alert rules' facts, the GPUs a sample batch names with their nodes or
holders, a cluster's devices for the Kubernetes readers),
each built by a plain function from the rows (or the line items read from them) and the
allocator held still.

The store answers reads and write commands with them; it never decides the wire format. The
service turns them into the API's JSON (``service/serialize/``), so a field's name or a time's
text is chosen in one place, and a store test asserts on typed values rather than on strings.
Times are the database's naive UTC ``datetime`` (``None`` where unset); the serializer writes
them as ISO 8601 with a ``Z`` (``timeparse.format_time``).
"""
