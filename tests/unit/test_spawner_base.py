"""The spawner mixin's pure parts: choosing and checking the offer, state, env, texts, config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from traitlets.config import Config

from jupyterhub_gpupool.hubconfig import configure_hub
from jupyterhub_gpupool.spawner.base import STATE_KEY, ordinal, spawn_error
from jupyterhub_gpupool.spawner.local import GPUPoolSimpleLocalProcessSpawner, device_env
from jupyterhub_gpupool.spawner.picker import OPTION, wait_text
from jupyterhub_gpupool.wording import units_text

LEASE = {
    "id": "L1",
    "offer": "a100-1g",
    "node": "n1",
    "slots": [
        {"gpu": "GPU-1", "kind": "mig", "profile": "1g.10gb", "start": 0, "mig_uuid": "MIG-9"}
    ],
}


def spawner(**traits) -> GPUPoolSimpleLocalProcessSpawner:
    user = SimpleNamespace(name="alice", groups=[SimpleNamespace(name="ml")], settings={})
    return GPUPoolSimpleLocalProcessSpawner(user=user, **traits)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (1, "1st"),
        (2, "2nd"),
        (3, "3rd"),
        (4, "4th"),
        (11, "11th"),
        (12, "12th"),
        (13, "13th"),
        (21, "21st"),
        (102, "102nd"),
        (111, "111th"),
    ],
)
def test_ordinal(n, text):
    assert ordinal(n) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "no estimate yet"),
        (0, "less than a minute"),
        (59, "less than a minute"),
        (60, "about 1 minute"),
        (240, "about 4 minutes"),
        (5400, "about 1.5 hours"),
    ],
)
def test_wait_text(seconds, text):
    assert wait_text(seconds) == text


@pytest.mark.parametrize(
    ("units", "text"),
    [
        (1 / 7, "1/7 GPU"),
        (0.25, "1/4 GPU"),
        (0.5, "1/2 GPU"),
        (3 / 7, "3/7 GPU"),
        (1.0, "1 GPU"),
        (2.0, "2 GPUs"),
        (0.3, "0.30 GPU"),
        (1 + 1 / 7, "1 1/7 GPUs"),
        (0.0, "0 GPUs"),
        (2.5, "2 1/2 GPUs"),
    ],
)
def test_units_text(units, text):
    assert units_text(units) == text


def test_offer_from_form_lists_api_strings_and_defaults():
    s = spawner()
    s.user_options = {OPTION: ["a100-1g"]}  # form data: lists of strings
    assert s.chosen_offer() == "a100-1g"
    s.user_options = {OPTION: " h100 "}  # API spawn: a string
    assert s.chosen_offer() == "h100"
    s.user_options = {}
    assert s.chosen_offer() == ""  # CPU only by default
    s = spawner(default_offer="t4-quarter")
    s.user_options = {}
    assert s.chosen_offer() == "t4-quarter"
    s = spawner(allow_cpu_only=False, pool_offers=["h100", "a100-1g"])
    s.user_options = {}
    assert s.chosen_offer() == "h100"


def test_offer_checks_refuse_what_the_picker_did_not_offer():
    s = spawner(pool_offers=["a100-1g"], allow_cpu_only=False)
    s.check_offer("a100-1g")
    with pytest.raises(Exception, match="not available here") as info:
        s.check_offer("h100")
    assert info.value.status_code == 403
    with pytest.raises(Exception, match="needs every server to hold a GPU"):
        s.check_offer("")
    s.user_options = {OPTION: 42}
    with pytest.raises(Exception, match="must be an offer name"):
        s.chosen_offer()


def test_state_round_trip_is_versioned():
    s = spawner()
    s.gpupool_lease = LEASE
    state = s.get_state()
    assert state[STATE_KEY]["version"] == 1 and state[STATE_KEY]["lease"] == "L1"
    t = spawner()
    t.load_state(state)
    assert t.gpupool_lease["id"] == "L1" and t.gpupool_lease["slots"] == LEASE["slots"]
    u = spawner()
    u.load_state({STATE_KEY: {"version": 99, "lease": "L2"}})
    assert u.gpupool_lease is None  # an unknown version is ignored, not misread
    # clear_state (which LocalProcessSpawner.poll calls when the process died) keeps the lease
    # until it is released
    t.clear_state()
    assert t.gpupool_lease["id"] == "L1"


def test_device_env_pins_exactly_the_granted_devices():
    assert device_env(LEASE) == {"CUDA_VISIBLE_DEVICES": "MIG-9", "NVIDIA_VISIBLE_DEVICES": "MIG-9"}
    two = {"id": "L", "slots": [{"gpu": "GPU-a", "kind": "gpu"}, {"gpu": "GPU-b", "kind": "gpu"}]}
    assert device_env(two)["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    shared = {"id": "L", "slots": [{"gpu": "GPU-t4", "kind": "shared", "milli": 250}]}
    assert device_env(shared) == {
        "CUDA_VISIBLE_DEVICES": "GPU-t4",
        "NVIDIA_VISIBLE_DEVICES": "GPU-t4",
        "GPUPOOL_GPU_FRACTION": "0.25",
    }
    assert device_env(None) == {"CUDA_VISIBLE_DEVICES": "-1", "NVIDIA_VISIBLE_DEVICES": "void"}
    pending = {"id": "L", "slots": [{"gpu": "GPU-1", "kind": "mig", "mig_uuid": None}]}
    with pytest.raises(ValueError, match="no instance yet"):
        device_env(pending)


def test_server_env_has_the_gpupool_variables():
    s = spawner(pool_api_url="http://pool/api/v1/", server_pool_api_url="http://proxy/api/v1/")
    s.gpupool_lease = LEASE
    assert s.gpupool_env() == {
        "GPUPOOL_LEASE_ID": "L1",
        "GPUPOOL_OFFER": "a100-1g",
        "GPUPOOL_API_URL": "http://proxy/api/v1/",
    }
    assert s.user_groups == ["ml"]
    # a CPU-only server still knows where the pool is (its lab offers to ask for a GPU)
    s.gpupool_lease = None
    assert s.gpupool_env() == {"GPUPOOL_API_URL": "http://proxy/api/v1/"}


def test_pool_url_comes_from_the_hub_service():
    service = SimpleNamespace(url="http://127.0.0.1:10101", prefix="/services/gpupool/")
    user = SimpleNamespace(name="alice", groups=[], settings={"services": {"gpupool": service}})
    s = GPUPoolSimpleLocalProcessSpawner(user=user)
    assert s._pool_url() == "http://127.0.0.1:10101/services/gpupool/api/v1/"
    s = spawner()
    with pytest.raises(Exception, match="not configured on this hub"):
        s._pool_url()


def test_spawn_error_carries_the_message_for_the_progress_page():
    e = spawn_error("No quota", reason="gpupool_no_quota", status=403)
    assert e.status_code == 403
    assert "No quota" in (getattr(e, "jupyterhub_message", None) or str(e))


def test_configure_hub_adds_to_existing_roles_and_services():
    c = Config()
    c.JupyterHub.services = [{"name": "idle-culler", "command": ["x"]}]
    c.JupyterHub.load_roles = [{"name": "user", "scopes": ["self", "read:users:name"]}]
    configure_hub(c, spawner_token="s3cret", pool_config="/p.yaml", admin_users=["root"])
    names = [s["name"] for s in c.JupyterHub.services]
    assert names == ["idle-culler", "gpupool", "gpupool-spawner"]
    pool = c.JupyterHub.services[1]
    assert pool["url"] == "http://127.0.0.1:10101"
    assert "--pool-config=/p.yaml" in pool["command"]
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert roles["user"]["scopes"] == [
        "self",
        "read:users:name",
        "custom:gpupool:use!user",
        "access:services!service=gpupool",  # the pool's own page, from the Services menu
    ]
    assert roles["gpupool-spawner"]["scopes"] == ["custom:gpupool:spawn"]
    assert roles["gpupool-admin"]["users"] == ["root"]
    assert "custom:gpupool:admin" in c.JupyterHub.custom_scopes
    assert c.JupyterHub.spawner_class.endswith("GPUPoolLocalProcessSpawner")
    assert c.GPUPoolSpawnerMixin.pool_api_token == "s3cret"
    with pytest.raises(ValueError, match="service_token"):
        configure_hub(Config(), spawner_token="x", command=None)


def test_the_address_the_reclaimer_reads_a_server_at():
    """What ``start`` returned plus the server's base URL; none with internal SSL (the
    reclaimer holds no client certificate, so it reads through the proxy)."""
    from jupyterhub_gpupool.spawner.address import internal_url

    assert internal_url(("127.0.0.1", 8888), "/user/alice/", False) == (
        "http://127.0.0.1:8888/user/alice/"
    )
    assert internal_url(("", 8888), "/user/a/", False) == "http://127.0.0.1:8888/user/a/"
    assert internal_url(("::1", 9000), "/user/a/x/", False) == "http://[::1]:9000/user/a/x/"
    assert internal_url("http://10.0.0.7:8888/", "/user/bob/", False) == (
        "http://10.0.0.7:8888/user/bob/"
    )
    assert internal_url(("127.0.0.1", 8888), "/user/alice/", True) is None
    assert internal_url(None, "/user/alice/", False) is None
