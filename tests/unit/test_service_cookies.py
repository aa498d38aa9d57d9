"""Replicas share the key that signs the pool pages' login cookies (or each logs users out)."""

from __future__ import annotations

import pytest
from tornado.web import create_signed_value, decode_signed_value
from traitlets import TraitError

from jupyterhub_gpupool.service.app import PoolService

SECRET = "ab" * 32


def app_secret(svc: PoolService) -> bytes:
    for name in ("store", "hub_auth", "hub", "metrics", "utilization", "minutes", "writer"):
        setattr(svc, name, None)  # make_app only passes them on
    return svc.make_app().settings["cookie_secret"]


def test_replicas_with_one_secret_read_each_others_cookies(monkeypatch):
    monkeypatch.setenv("GPUPOOL_COOKIE_SECRET", SECRET)
    first, second = app_secret(PoolService()), app_secret(PoolService())
    cookie = create_signed_value(first, "gpupool-session", "alice")
    assert decode_signed_value(second, "gpupool-session", cookie) == b"alice"


def test_without_a_secret_each_process_signs_with_its_own(monkeypatch):
    monkeypatch.delenv("GPUPOOL_COOKIE_SECRET", raising=False)
    first, second = app_secret(PoolService()), app_secret(PoolService())
    cookie = create_signed_value(first, "gpupool-session", "alice")
    assert decode_signed_value(second, "gpupool-session", cookie) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [("not-hex", "hexadecimal"), ("abcd", "at least 32")],
)
def test_a_bad_secret_is_refused_with_what_is_wrong(value, message):
    with pytest.raises(TraitError, match=message):
        PoolService(cookie_secret=value)
