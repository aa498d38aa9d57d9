"""Expected refusals are logged as one warning without a traceback (issue 30): the record
JupyterHub writes when the pool spawner refuses a GPU asked for by a link, and the service's
refused API calls; anything else keeps its level and traceback. Duplicate GPU indexes in an
inventory are refused naming the field; a what-if range outside the records is refused before
anything is counted."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import pytest
from jupyterhub.spawner import SpawnException

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.logquiet import EXPECTED, quiet_expected_refusals
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.service.ingest import InventoryError, node_from_inventory
from jupyterhub_gpupool.simulate.whatif import Change, WhatIfError, what_if
from tests.fakes import StoreClock, make_store


def hub_logs(logger: logging.Logger, exc: Exception) -> None:
    """What JupyterHub's SpawnHandler does when ``options_from_query`` raises."""
    try:
        raise exc
    except Exception:
        logger.error("Failed to spawn single-user server with query arguments", exc_info=True)


def test_a_refused_link_spawn_is_a_warning_without_traceback(caplog) -> None:
    logger = logging.getLogger("test-hub")
    quiet_expected_refusals(logger)
    quiet_expected_refusals(logger)  # once only
    assert len(logger.filters) == 1
    refusal = SpawnException("A GPU is not handed out from a link", reason="gpupool_query")
    refusal.jupyterhub_message = "A GPU is not handed out from a link"
    setattr(refusal, EXPECTED, True)
    with caplog.at_level(logging.DEBUG, logger="test-hub"):
        hub_logs(logger, refusal)
        hub_logs(logger, RuntimeError("a real fault"))
    quiet, fault = caplog.records
    assert quiet.levelno == logging.WARNING and quiet.exc_info is None
    assert quiet.getMessage() == (
        "Failed to spawn single-user server with query arguments: "
        "A GPU is not handed out from a link"
    )
    assert "Traceback" not in logging.Formatter().format(quiet)
    assert fault.levelno == logging.ERROR and fault.exc_info is not None


def test_a_gpu_index_twice_on_a_node_is_refused() -> None:
    gpus = [
        {"uuid": "GPU-a", "index": 0, "model": "T4"},
        {"uuid": "GPU-b", "index": 0, "model": "T4"},
    ]
    with pytest.raises(InventoryError) as e:
        node_from_inventory("n", {"gpus": gpus}, default_catalog())
    assert e.value.field == "gpus[1].index" and "appears twice" in e.value.detail
    gpus[1]["index"] = 1
    assert [g.index for g in node_from_inventory("n", {"gpus": gpus}, default_catalog()).gpus] == [
        0,
        1,
    ]


def test_a_what_if_range_outside_the_records_is_refused_first(db_url, clock: StoreClock) -> None:
    upgrade(db_url)
    store = make_store(db_url, clock)
    store.allocate("alice", "", "h100")
    now = store.clock()
    change = Change((), (), None, {})
    for until, words in ((now - timedelta(days=9834), "before the first recorded request"),):
        with pytest.raises(WhatIfError) as e:
            what_if(store, 1, change, until)
        assert e.value.field == "until" and words in str(e.value)
        assert "holds" not in str(e.value)  # not "the database holds -9834 days"
    assert isinstance(now, datetime)
