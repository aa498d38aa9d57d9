"""Fixtures of the unit tests (the helpers themselves live in the tests/fakes/ package)."""

from __future__ import annotations

import pytest

from tests.fakes import StoreClock


@pytest.fixture
def clock() -> StoreClock:
    """The store's clock, at ``STORE_T0``; the test moves it (``clock.advance(seconds=30)``).
    Modules whose fakes run on another clock (the simulated NVML's) override this fixture."""
    return StoreClock()
