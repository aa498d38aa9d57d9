"""``allow_offer_from_query``: a link (``GET /hub/spawn?...``) never takes a GPU by default.

JupyterHub hands the query arguments of ``/hub/spawn`` to ``Spawner.options_from_query`` and
spawns at once when it returns; raising there ends it before any lease exists (the hub shows the
form again with the message). These tests call it as the hub does: a dict of lists of strings
(JupyterHub 6 strips an ``opt-`` prefix first, 5 passes the key as it is).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from jupyterhub_gpupool.logquiet import EXPECTED, ExpectedRefusals
from jupyterhub_gpupool.spawner.local import GPUPoolSimpleLocalProcessSpawner
from jupyterhub_gpupool.spawner.picker import OPTION

REFUSED = "A GPU is not handed out from a link"


def spawner(**traits) -> GPUPoolSimpleLocalProcessSpawner:
    user = SimpleNamespace(name="alice", groups=[], settings={})
    return GPUPoolSimpleLocalProcessSpawner(user=user, **traits)


def from_query(s: GPUPoolSimpleLocalProcessSpawner, query: dict) -> dict:
    return asyncio.run(s.options_from_query(query))


@pytest.mark.parametrize(
    "query",
    [
        {OPTION: ["t4-quarter"]},  # /hub/spawn?gpupool_offer=… (and 6's opt- prefix, stripped)
        {f"opt-{OPTION}": ["t4-quarter"]},  # JupyterHub 5 keeps the prefix
        {OPTION: [""]},  # naming the offer at all: even "no GPU" is chosen in the form
    ],
)
def test_an_offer_in_the_query_is_refused_by_default(query):
    s = spawner()
    with pytest.raises(Exception, match=REFUSED) as info:
        from_query(s, query)
    assert info.value.status_code == 403
    assert info.value.jupyterhub_message.startswith(REFUSED)  # what the spawn page shows
    # an expected refusal: the hub's "Failed to spawn" line becomes one warning, no traceback
    assert getattr(info.value, EXPECTED) is True
    assert any(isinstance(f, ExpectedRefusals) for f in s.log.filters)


@pytest.mark.parametrize(
    "traits",
    [
        {"default_offer": "t4-quarter"},  # the link would spawn with the default GPU
        {"allow_cpu_only": False, "pool_offers": ["h100"]},  # every server holds a GPU
    ],
)
def test_a_link_that_would_take_a_default_gpu_is_refused(traits):
    s = spawner(**traits)
    with pytest.raises(Exception, match=REFUSED):
        from_query(s, {"unrelated": ["1"]})
    assert s.user_options == {}  # looking at what the spawn would ask left nothing behind


def test_a_link_without_a_gpu_spawns_as_jupyterhub_does():
    s = spawner()
    assert from_query(s, {"unrelated": ["1"]}) == {"unrelated": ["1"]}


def test_allowed_the_query_chooses_the_offer():
    s = spawner(allow_offer_from_query=True)
    options = from_query(s, {OPTION: ["t4-quarter"]})
    assert options == {OPTION: ["t4-quarter"]}
    s.user_options = options
    assert s.chosen_offer() == "t4-quarter"
    allowed = spawner(allow_offer_from_query=True, default_offer="t4-quarter")
    assert from_query(allowed, {"unrelated": ["1"]}) == {"unrelated": ["1"]}


def test_the_trait_is_configurable_with_help():
    trait = GPUPoolSimpleLocalProcessSpawner.class_traits()["allow_offer_from_query"]
    assert trait.default_value is False
    assert trait.metadata.get("config") is True
    assert "link" in trait.help


def test_a_kubespawner_profile_naming_a_gpu_is_refused_from_a_link(monkeypatch):
    """``/hub/spawn?profile=gpu``: the profile's kubespawner_override names the offer."""
    kubespawner = pytest.importorskip("kubespawner.spawner")
    from jupyterhub_gpupool.spawner.kube import GPUPoolKubeSpawner

    monkeypatch.setattr(kubespawner, "load_config", lambda **kw: None)
    monkeypatch.setattr(kubespawner, "shared_client", lambda name: None)
    user = SimpleNamespace(
        name="alice", groups=[], settings={}, url="/user/alice/", id=1, escaped_name="alice"
    )
    s = GPUPoolKubeSpawner(
        _mock=True,
        user=user,
        profile_list=[
            {"display_name": "CPU", "slug": "cpu", "default": True},
            {"display_name": "GPU", "slug": "gpu", "kubespawner_override": {OPTION: "h100"}},
        ],
    )
    assert from_query(s, {"profile": ["cpu"]}) == {"profile": "cpu"}
    with pytest.raises(Exception, match=REFUSED):
        from_query(s, {"profile": ["gpu"]})
