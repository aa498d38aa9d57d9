"""Secrets never reach a log: token query values and Authorization headers are redacted.

JupyterHub writes ``[secret]`` for a ``token=`` in the URLs it logs; the pool's processes (the
service, the node agent, the reclaimer, the spawner's messages) do the same through one filter
installed on their log handlers, so a URL, a header dump or an exception text that carries a
token is cut before it is written anywhere.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

SECRET = "[secret]"
_QUERY = re.compile(
    r"(?P<key>(?:^|(?<=[?&;\s\"'(]))(?:token|api_token|access_token|_xsrf)=)[^&\s#\"')]+",
    re.IGNORECASE,
)
_HEADER = re.compile(
    r"(?P<key>authorization[\"']?\s*[:=]\s*[\"']?(?:token|bearer|basic)?\s*)"
    r"[A-Za-z0-9._~+/=-]{4,}",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with token query values and Authorization header values replaced."""
    if "=" not in text and ":" not in text:
        return text
    text = _QUERY.sub(lambda m: m.group("key") + SECRET, text)
    return _HEADER.sub(lambda m: m.group("key") + SECRET, text)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts the formatted message (and an exception's text)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            formatted = logging.Formatter().formatException(record.exc_info)
            if redact(formatted) != formatted:
                record.exc_text = redact(formatted)
        return True


#: Loggers whose records we redact at the source (tornado logs request URIs itself).
SOURCES = ("tornado.access", "tornado.application", "tornado.general", "jupyterhub_gpupool")


def install(loggers: Iterable[logging.Logger] = ()) -> RedactingFilter:
    """Put one redacting filter on the root logger's handlers, on ``loggers`` and their
    handlers, and on the loggers that write request URIs; returns it."""
    flt = RedactingFilter()
    targets = [logging.getLogger(), *(logging.getLogger(n) for n in SOURCES), *loggers]
    for logger in targets:
        if flt not in logger.filters:
            logger.addFilter(flt)
        for handler in logger.handlers:
            if flt not in handler.filters:
                handler.addFilter(flt)
    return flt
