"""The pool service: a JupyterHub service owning the allocator, the database and the API."""
