"""The API's JSON for the store's read models (``store/read/``): one function per model,
``<model>_json(view) -> dict``, the only place a field's wire name and a time's text are
decided. Handlers write what these return; nothing else builds a response body from a read
model."""
