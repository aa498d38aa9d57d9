"""REST API v1 handlers, one module per resource; each ends with ``default_handlers``."""
