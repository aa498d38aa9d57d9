"""Expected refusals are one warning line, never an error with a traceback.

The pool's refusals are answers, not faults: the service logs a refused API call as one warning
(``apihandlers.base.APIHandler.log_exception``). One path is JupyterHub's own: when a spawner's
``options_from_query`` raises, the hub logs "Failed to spawn single-user server with query
arguments" at error level with the traceback, whatever the exception — so the pool spawner's
refusal of a GPU asked for by a link (``allow_offer_from_query`` off) would read as a crash.
The spawner marks such an exception ``gpupool_expected`` and installs this filter on the hub's
logger; the filter turns a record whose exception is so marked into a warning with the
refusal's message and no traceback. Every other record passes unchanged.
"""

from __future__ import annotations

import logging

#: The attribute that marks an exception as an expected refusal.
EXPECTED = "gpupool_expected"


class ExpectedRefusals(logging.Filter):
    """Downgrade records of expected refusals: warning level, the message, no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None or not getattr(exc, EXPECTED, False):
            return True
        message = getattr(exc, "jupyterhub_message", None) or str(exc)
        original = record.getMessage()
        record.msg, record.args = "%s: %s", (original, message)
        record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


def quiet_expected_refusals(logger: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
    """Install ``ExpectedRefusals`` on ``logger`` (once)."""
    target = logger.logger if isinstance(logger, logging.LoggerAdapter) else logger
    if not any(isinstance(f, ExpectedRefusals) for f in target.filters):
        target.addFilter(ExpectedRefusals())
