"""The one home of what several test modules share: fakes, clocks, rigs and waiting.

Test modules import helpers from here (or get them as conftest fixtures), never from one
another: ``tests/unit/test_test_layout.py`` fails when a module imports a ``test_*`` module.
Every helper is re-exported here (``from tests.fakes import X``); each part lives in its own
module:

* :mod:`~tests.fakes.waiting` — waiting without racing the clock: :func:`wait_until`,
  :func:`wait_until_async`, :func:`until`, :func:`wait_past_deadline`.
* :mod:`~tests.fakes.clocks` — clocks the test moves: :class:`StoreClock`,
  :class:`SecondsClock`, :class:`ClockFile` and :func:`clocked_service_python`.
* :mod:`~tests.fakes.store` — :data:`STORE_POOL` and the other store pools,
  :func:`make_store`, :func:`make_instances`, :func:`lease_events`.
* :mod:`~tests.fakes.agent` — the node agent with no real time and no socket
  (:class:`FakeReader`, :class:`FakeService`, :func:`make_agent`, :func:`run_for`) and the
  simulated :class:`Rig`.
* :mod:`~tests.fakes.hub` — the hub environment (:class:`HubEnv`, :func:`request`, from
  ``tests/integration/hubenv.py``, reached by tests through this package only),
  :func:`wait_reconciled`, :func:`write_pool`.
* :mod:`~tests.fakes.reclaim` — the reclaim rig: :class:`SimAgent`, :class:`KernelDriver`.
* :mod:`~tests.fakes.lab` — the lab package's hub and an open tab: :func:`lab_hub`,
  :class:`LabTab`, :func:`start_server`, :func:`stop_server`.
* :mod:`~tests.fakes.kube` and :mod:`~tests.fakes.kubenodes` — a Kubernetes API server over
  real HTTP (:class:`FakeKubeAPI`, :func:`kubeconfig`, :func:`self_signed_cert`) and its GPU
  nodes (:func:`kube_node`).
* :mod:`~tests.fakes.service` — the pool service in-process: :class:`InProcessService`,
  :class:`TokenHubAuth`.

Store and service modules are imported inside the helpers that need them, so a unit test of
the agent does not import the store.
"""

from __future__ import annotations

from tests.fakes.agent import AGENT_API, Call, FakeReader, FakeService, Rig, make_agent, run_for
from tests.fakes.clocks import (
    AGENT_T0,
    STORE_T0,
    ClockFile,
    SecondsClock,
    StoreClock,
    clocked_service_python,
)
from tests.fakes.hub import (
    ROOT,
    SPAWNER_CONFIG,
    HubEnv,
    Response,
    chp_command,
    free_port,
    reconciles,
    request,
    wait_http,
    wait_reconciled,
    write_pool,
)
from tests.fakes.kube import FakeKubeAPI, kubeconfig, self_signed_cert
from tests.fakes.kubenodes import FAKE_MIG_CONFIGS, kube_node
from tests.fakes.lab import (
    LAB_POOL,
    LabTab,
    lab_hub,
    server_environ,
    start_server,
    stop_server,
    user_server,
)
from tests.fakes.reclaim import KernelDriver, SimAgent
from tests.fakes.service import InProcessService, TokenHubAuth
from tests.fakes.store import (
    APPROVAL_POOL,
    BILL_POOL,
    STORE_POOL,
    lease_events,
    make_instances,
    make_store,
)
from tests.fakes.waiting import (
    PATIENCE,
    WaitTimeout,
    until,
    wait_past_deadline,
    wait_until,
    wait_until_async,
)

__all__ = [
    "AGENT_API",
    "AGENT_T0",
    "APPROVAL_POOL",
    "BILL_POOL",
    "FAKE_MIG_CONFIGS",
    "LAB_POOL",
    "PATIENCE",
    "ROOT",
    "SPAWNER_CONFIG",
    "STORE_POOL",
    "STORE_T0",
    "Call",
    "ClockFile",
    "FakeKubeAPI",
    "FakeReader",
    "FakeService",
    "HubEnv",
    "InProcessService",
    "KernelDriver",
    "LabTab",
    "Response",
    "Rig",
    "SecondsClock",
    "SimAgent",
    "StoreClock",
    "TokenHubAuth",
    "WaitTimeout",
    "chp_command",
    "clocked_service_python",
    "free_port",
    "kube_node",
    "kubeconfig",
    "lab_hub",
    "lease_events",
    "make_agent",
    "make_instances",
    "make_store",
    "reconciles",
    "request",
    "run_for",
    "self_signed_cert",
    "server_environ",
    "start_server",
    "stop_server",
    "until",
    "user_server",
    "wait_http",
    "wait_past_deadline",
    "wait_reconciled",
    "wait_until",
    "wait_until_async",
    "write_pool",
]
