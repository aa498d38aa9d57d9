"""Tokens never reach a log: query values and Authorization headers are redacted by the one
filter every pool process installs, and by the pool client's error texts (the spawner logs
them and shows them on the spawn page)."""

from __future__ import annotations

import io
import logging

import pytest

from jupyterhub_gpupool.logredact import SECRET, RedactingFilter, install, redact
from jupyterhub_gpupool.poolclient import PoolRefused, PoolUnavailable

TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            f"401 GET /api/v1/users/bob?token={TOKEN} 3.2ms",
            "401 GET /api/v1/users/bob?token=[secret] 3.2ms",
        ),
        (f"GET /x?a=1&token={TOKEN}&b=2", "GET /x?a=1&token=[secret]&b=2"),
        (f"GET /x?access_token={TOKEN}#top", "GET /x?access_token=[secret]#top"),
        (
            f'headers: {{"Authorization": "token {TOKEN}"}}',
            'headers: {"Authorization": "token [secret]"}',
        ),
        (f"Authorization: Bearer {TOKEN}", "Authorization: Bearer [secret]"),
        ("the token expired", "the token expired"),
        ("no secrets: offer=h100", "no secrets: offer=h100"),
    ],
)
def test_redact(text: str, expected: str):
    assert redact(text) == expected


def test_the_filter_redacts_formatted_messages_and_tracebacks():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("test-logredact")
    logger.propagate = False
    logger.addHandler(handler)
    handler.addFilter(RedactingFilter())
    try:
        logger.warning("%d %s %s", 401, "GET", f"/pool?token={TOKEN}")
        try:
            raise RuntimeError(f"could not fetch /api?token={TOKEN}")
        except RuntimeError:
            logger.exception("fetch failed")
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert TOKEN not in out
    assert out.count(f"token={SECRET}") >= 2 and "401 GET /pool" in out  # message, traceback


def test_install_puts_one_filter_on_the_root_handlers_and_the_given_loggers():
    app = logging.getLogger("test-logredact-app")
    handler = logging.StreamHandler(io.StringIO())
    app.addHandler(handler)
    try:
        flt = install([app])
        again = install([app])  # idempotent: never two filters of ours on one handler
        assert flt in handler.filters or again in handler.filters
        assert sum(isinstance(f, RedactingFilter) for f in handler.filters) <= 2
        assert any(
            isinstance(f, RedactingFilter) for f in logging.getLogger("tornado.access").filters
        )
    finally:
        app.removeHandler(handler)


def test_pool_client_errors_carry_no_token():
    for error in (
        PoolUnavailable(f"GPU pool service unreachable at http://h/api?token={TOKEN}: refused"),
        PoolRefused(f"refused Authorization: token {TOKEN}", status=403, code="forbidden"),
    ):
        assert TOKEN not in str(error) and TOKEN not in error.message
