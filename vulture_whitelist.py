"""Names vulture (``make lint``) takes for unused but that something outside our code calls.

Vulture runs at 80% confidence ([tool.vulture] in pyproject.toml): it reports unused imports,
variables and arguments, and unreachable code. Framework entry points (traitlets ``@default``,
``@validate`` and ``@observe`` methods, tornado handlers' ``get``/``post``, alembic's
``upgrade``/``downgrade``, pytest fixtures) are 60% findings and so are not reported at that
level; what is listed here is used by name from outside.
"""

# The simulated NVML mirrors pynvml's signatures argument for argument (callers may pass them
# by keyword): telemetry/simnvml.py nvmlDeviceGetTotalEccErrors(handle, errorType, counterType)
counterType  # noqa: B018, F821
