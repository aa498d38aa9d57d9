"""The bounds of what a pool config (and the API, where it takes the same values) may declare.

Every name the pool config gives (node, offer, group, user, label) is one the REST API can be
asked about: 1 to 255 characters (the database's name columns), no control character (NUL
included: PostgreSQL cannot store it) and no ``/`` (a path segment such as ``nodes/{name}``
cannot hold one). Every count has a documented maximum, so that start-up time and memory are
bounded by construction (at most ``MAX_GPUS`` GPU objects, ``MAX_OFFERS`` offers, ...), and
every amount a maximum a pool can mean. ``docs/source/reference/pool-config.md`` lists them.
"""

from __future__ import annotations

import unicodedata

from .errors import ConfigError

#: Names: the API's string bound (``apihandlers.base.MAX_STR``, the database's columns).
MAX_NAME = 255
#: Free text shown to people (an offer's display name and description).
MAX_TEXT = 16_384
#: Integers stored in the database's 32-bit columns (CPU milli-cores, MiB, priorities).
MAX_INT = 2**31 - 1
#: Nodes in one pool config.
MAX_NODES = 10_000
#: GPUs on one node (an HGX has 8, the largest nodes 16).
MAX_GPUS_PER_NODE = 64
#: GPUs in one pool config, all nodes together.
MAX_GPUS = 100_000
#: Offers in one pool config.
MAX_OFFERS = 1_000
#: Groups one offer names; labels on one node (as the agent's inventory report allows).
MAX_GROUPS_PER_OFFER = 1_000
MAX_LABELS = 256
#: Users and groups with a quota of their own in the pool config, together.
MAX_QUOTAS = 100_000
#: A quota's guarantee, limit and exception ceiling, in GPU units.
MAX_UNITS = 1_000_000
#: A quota's budget, in GPU unit-hours per period.
MAX_BUDGET = 1_000_000_000
#: A price per GPU unit-hour (any currency).
MAX_PRICE = 1_000_000
#: An offer's minimum GPU memory, in GB (1 TiB, the bound on a GPU's memory).
MAX_MEMORY_GB = 1024


def shown(value: object, width: int = 40) -> str:
    """``repr(value)``, cut to ``width`` characters: an error line stays one short line."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def bad_character(name: str) -> str | None:
    """The first character of ``name`` a name may not hold (described), or None."""
    for ch in name:
        if ch == "/":
            return "'/'"
        if unicodedata.category(ch) == "Cc":
            return f"control character U+{ord(ch):04X}"
    return None


def check_name(value: object, field: str, what: str = "a name") -> str:
    """``value`` if it is a name the API can address, else a ConfigError naming ``field``
    and the bound."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{what} must be a non-empty string, got {shown(value)}", field=field)
    if len(value) > MAX_NAME:
        raise ConfigError(
            f"{what} must be at most {MAX_NAME} characters, got {len(value)}", field=field
        )
    bad = bad_character(value)
    if bad is not None:
        raise ConfigError(
            f"{what} may not hold a {bad} (at most {MAX_NAME} characters, no control "
            f"characters, no '/'), got {shown(value)}",
            field=field,
        )
    return value


def check_text(value: object, field: str, limit: int = MAX_TEXT) -> str:
    """Free text of at most ``limit`` characters, without NUL."""
    if not isinstance(value, str):
        raise ConfigError(f"must be text, got {shown(value)}", field=field)
    if len(value) > limit:
        raise ConfigError(f"must be at most {limit} characters, got {len(value)}", field=field)
    if "\x00" in value:
        raise ConfigError("may not hold NUL", field=field)
    return value


def check_count(value: int, field: str, maximum: int, what: str) -> int:
    """``value`` unless above ``maximum`` (a ConfigError naming the bound)."""
    if value > maximum:
        raise ConfigError(f"at most {maximum:,} {what}, got {shown(value)}", field=field)
    return value
