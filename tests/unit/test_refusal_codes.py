"""Refusal codes are declared once (``pool/codes.py``), each has one HTTP status
(``service/apihandlers/errors.py``), the spawn page and the picker phrase them from the
declaration, and the OpenAPI spec lists them. A code raised anywhere in the project without
those fails here, found by reading the source (``ast``), not by a list kept beside it."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest
import yaml

from jupyterhub_gpupool.pool.codes import CODES, GENERIC_SPAWN, describe, picker_reason
from jupyterhub_gpupool.pool.errors import PoolError, Refusal
from jupyterhub_gpupool.service.apihandlers.errors import GENERIC, STATUS, APIError, status_of
from jupyterhub_gpupool.store import StoreError

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    p
    for folder in ("jupyterhub_gpupool", "spawner")
    for p in sorted((ROOT / folder).rglob("*.py"))
    # the client reads codes off the wire; the migrations and the simulator raise none
    if p.name != "poolclient.py" and "alembic" not in p.parts
]
#: Constructors whose first positional argument is a refusal code.
CODE_FIRST = {"StoreError", "APIError", "Refusal"}


def _codes_in(path: Path) -> set[tuple[str, int]]:
    """(code, line) of every code literal the module raises or decides with."""
    found: set[tuple[str, int]] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            args = node.args
            first = args[0] if args and name in CODE_FIRST else None
            if isinstance(first, ast.Constant):
                found.add((first.value, node.lineno))
            if name == "Rejected" and len(args) > 1 and isinstance(args[1], ast.Constant):
                found.add((args[1].value, node.lineno))
            for kw in node.keywords:
                if kw.arg == "code" and isinstance(kw.value, ast.Constant):
                    found.add((kw.value.value, node.lineno))
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.Assign)
                    and [getattr(t, "id", None) for t in stmt.targets] == ["code"]
                    and isinstance(stmt.value, ast.Constant)
                ):
                    found.add((stmt.value.value, stmt.lineno))
    return found


@cache
def raised() -> dict[str, list[str]]:
    """code → where it is raised (file:line)."""
    out: dict[str, list[str]] = {}
    for path in SOURCES:
        for code, line in _codes_in(path):
            out.setdefault(code, []).append(f"{path.relative_to(ROOT)}:{line}")
    return out


def spec_codes() -> set[str]:
    spec = yaml.safe_load((ROOT / "docs/source/_static/rest-api.yml").read_text())
    error = spec["components"]["schemas"]["Error"]["properties"]["error"]
    return set(error["properties"]["code"]["enum"])


def test_the_scan_sees_the_codes_of_every_layer():
    """A scan that found nothing would pass everything below."""
    codes = raised()
    for code in (
        "not_found",
        "already_allocated",
        "exceeds_limit",
        "invalid_json",
        "unknown_offer",
    ):
        assert code in codes, code
    assert len(codes) >= 30


@pytest.mark.parametrize("code", sorted(raised()))
def test_every_raised_code_is_declared_mapped_phrased_and_in_the_spec(code: str):
    where = ", ".join(raised()[code])
    assert code in CODES, f"{code!r} ({where}) is not declared in pool/codes.py"
    assert code in STATUS, f"{code!r} ({where}) has no HTTP status in apihandlers/errors.py"
    assert code in spec_codes(), f"{code!r} ({where}) is not listed in the OpenAPI spec"
    sentence = describe(code).spawn_message("h100", "the pool's words")
    assert sentence and "{" not in sentence


def test_declarations_table_and_spec_list_the_same_codes():
    assert set(CODES) == set(STATUS) == spec_codes()
    assert set(GENERIC.values()) <= set(CODES)
    assert all(400 <= status < 600 for status in STATUS.values())


def test_every_declared_code_means_something():
    for code in CODES.values():
        assert code.meaning.endswith(".") and len(code.meaning) > 10, code.name


def test_quota_verdicts_have_a_picker_phrase():
    """What the picker writes beside an offer the quota does not allow."""
    quota = ROOT / "jupyterhub_gpupool" / "pool" / "quota.py"
    verdicts = {code for code, _ in _codes_in(quota)}
    assert verdicts >= {"no_quota", "exceeds_limit", "over_limit", "budget_exhausted"}
    for code in verdicts:
        assert CODES[code].picker, f"quota verdict {code!r} has no picker phrase"
        assert picker_reason(code) == CODES[code].picker
    assert picker_reason(None) == ""


def test_spawn_sentences_fill_in_the_offer_and_the_message():
    assert describe("no_quota").spawn_message("h100", "x") == (
        "You have no GPU quota on this hub; ask an administrator for one."
    )
    assert describe("unknown_offer").spawn_message("h100", "x") == (
        "There is no GPU offer called 'h100' (any more)."
    )
    assert describe("exceeds_limit").spawn_message("h100", "over by 1") == (
        "h100 would take you over your GPU quota: over by 1."
    )
    assert describe("not_live").spawn == GENERIC_SPAWN
    assert describe("never_declared").name == "pool_error"


def test_errors_carry_no_status_and_map_through_the_table():
    refusal = StoreError("not_ready", "wait", field="id")
    assert not hasattr(refusal, "status")
    assert status_of(refusal) == 409
    assert status_of(APIError("invalid_json", "no")) == 400
    assert status_of(PoolError("no", code="invalid_mig_layout")) == 422
    assert isinstance(refusal, Refusal)


def test_an_http_layer_message_is_answered_as_written():
    """The pool's own errors prefix the field; the HTTP layer's do not (bodies unchanged)."""
    assert APIError("missing_field", "offer is required", field="offer").to_dict() == {
        "error": {"code": "missing_field", "message": "offer is required", "field": "offer"}
    }
    assert StoreError("not_found", "no lease 'x'", field="id").message == "id: no lease 'x'"
