"""The pool as Kueue's AdmissionCheck controller, against the fake Kubernetes API server over
real HTTP (its Kueue routes validate every status patch against Kueue's field names) with a
simulated Kueue (``tests.fakekube_kueue.kueue_step``), writing through the service's writer
into the real store (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.kube import kueue as kq
from jupyterhub_gpupool.kube.client import KubeError
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.service.writer import BatchWriter
from tests import fakekube_kueue as fk
from tests.fakes import FakeKubeAPI, StoreClock, kube_node, make_store

#: One H100; alice (interactive) has a guarantee of one, the ml team's training borrows.
POOL: dict[str, Any] = {
    "nodes": [{"name": "gpu-1", "gpus": [{"model": "H100-80GB", "count": 1}]}],
    "offers": [{"name": "h100", "kind": "gpu", "models": ["H100-80GB"]}],
    "quotas": {
        "default": {"guarantee": 0, "limit": 2},
        "users": {"alice": {"guarantee": 1, "limit": 2}},
    },
    "classes": {"inference": {"allowed_groups": ["serving"]}, "training": {"grace": 120}},
}
CHECK = "gpupool"
LABELS = {kq.OFFER_LABEL: "h100", kq.CLASS_LABEL: "training"}


@pytest.fixture
def kube():
    with FakeKubeAPI([kube_node("gpu-1", product="NVIDIA-H100-80GB-HBM3")]) as api:
        fk.add(api, fk.admission_check(CHECK, kq.CONTROLLER))
        fk.add(api, fk.admission_check("other", "example.com/other"))
        yield api


@pytest.fixture
def rig(db_url: str, kube: FakeKubeAPI, tmp_path: Path):
    upgrade(db_url)
    clock = StoreClock()
    store = make_store(db_url, clock, POOL)
    token = tmp_path / "token"
    token.write_text(kube.token + "\n")
    ctl = kq.KueueAdmission(
        enabled=True, api_host=kube.url, token_file=str(token), namespace_users={"ml": "trainer"}
    )
    return store, ctl, clock


class Rounds:
    """Housekeeping rounds: Kueue's step, then the controller's (as the service runs them)."""

    def __init__(self, store: Any, ctl: kq.KueueAdmission, kube: FakeKubeAPI) -> None:
        self.store, self.ctl, self.kube = store, ctl, kube

    def __call__(self, *extra: commands.Command) -> dict[str, str]:
        async def go() -> dict[str, str]:
            writer = BatchWriter(self.store)
            writer.start()
            try:
                for c in extra:
                    await writer.run(c)
                fk.kueue_step(self.kube)
                out = await self.ctl.step(self.store, writer.run)
                fk.kueue_step(self.kube)
                return out
            finally:
                writer.stop()
                await self.ctl.close()

        return asyncio.run(go())


def check_of(kube: FakeKubeAPI, name: str, ns: str = "ml") -> dict[str, Any]:
    wl = fk.get(kube, ns, name)
    return next(c for c in wl["status"]["admissionChecks"] if c["name"] == CHECK)


def cond(kube: FakeKubeAPI, name: str, kind: str, ns: str = "ml") -> bool:
    return kq.condition(fk.get(kube, ns, name), kind) is not None


def test_a_workload_is_admitted_on_a_job_lease_pinned_to_the_node(rig, kube):
    store, ctl, _ = rig
    wl = fk.add(kube, fk.workload("ml", "train-1", [CHECK, "other"], LABELS, ("main", "workers")))
    rounds = Rounds(store, ctl, kube)
    assert rounds() == {"ml/train-1": "Ready"}
    job = store.kueue_jobs()[0]
    assert job.user == "trainer" and job.workload == "training" and job.runner == "kueue"
    assert job.runner_ref == {"namespace": "ml", "name": "train-1", "uid": wl["metadata"]["uid"]}
    check = check_of(kube, "train-1")
    assert check["state"] == "Ready" and job.lease_id in check["message"]
    devices = job.devices[0].gpu
    assert check["podSetUpdates"] == [
        {
            "name": ps,
            "labels": {kq.LEASE_LABEL: job.lease_id, kq.JOB_LABEL: job.id},
            "annotations": {kq.DEVICES_ANNOTATION: devices},
            "nodeSelector": {"kubernetes.io/hostname": "gpu-1"},
        }
        for ps in ("main", "workers")
    ]
    # the other controller's check is left as it was: Kueue does not admit yet
    entries = fk.get(kube, "ml", "train-1")["status"]["admissionChecks"]
    assert [c["state"] for c in entries if c["name"] == "other"] == ["Pending"]
    assert not cond(kube, "train-1", "Admitted")
    # once every check is Ready Kueue admits it: the job runs; quiet rounds write nothing
    with kube._lock:
        for c in kube.objects[("workloads", "ml", "train-1")]["status"]["admissionChecks"]:
            c["state"] = "Ready"
    fk.kueue_step(kube)
    assert cond(kube, "train-1", "Admitted")
    patches = len([c for c in kube.calls if c[0] == "PATCH"])
    assert rounds() == {}
    assert store.job(job.id).state == "running"
    assert len([c for c in kube.calls if c[0] == "PATCH"]) == patches
    # the runner timeout does not apply: the Workload is its liveness
    store.clock.advance(hours=1)
    store.reconcile(set())
    assert store.job(job.id).state == "running"
    assert store.node_jobs("gpu-1") == []  # the local runner never sees it
    # it finishes: the job succeeds and the lease is released
    fk.finish(kube, "ml", "train-1")
    assert rounds() == {"ml/train-1": "finished"}
    done = store.job(job.id)
    assert done.state == "succeeded" and store.lease(job.lease_id).state == "released"


def test_a_full_pool_keeps_the_check_pending_with_the_queue_position(rig, kube):
    store, ctl, clock = rig
    rounds = Rounds(store, ctl, kube)
    fk.add(kube, fk.workload("ml", "first", [CHECK], LABELS))
    rounds()
    fk.add(kube, fk.workload("ml", "second", [CHECK], LABELS))
    assert rounds() == {"ml/second": "Pending"}
    clock.advance(seconds=1)  # arrivals in order
    fk.add(kube, fk.workload("ml", "third", [CHECK], LABELS))
    assert rounds() == {"ml/third": "Pending"}
    assert check_of(kube, "second")["message"] == "GPU pool: queued for h100, position 1"
    assert check_of(kube, "third")["message"] == "GPU pool: queued for h100, position 2"
    assert len(store.kueue_jobs()) == 3  # one job per Workload however many rounds
    # the first Workload is deleted: its lease goes, the second is granted
    with kube._lock:
        del kube.objects[("workloads", "ml", "first")]
    out = rounds()
    assert out["ml/first"] == "deleted"
    rounds(commands.Promote())  # the next housekeeping round serves the queue first
    assert check_of(kube, "second")["state"] == "Ready"
    assert check_of(kube, "third")["message"] == "GPU pool: queued for h100, position 1"
    first = next(j for j in store.list_jobs() if j.name == "ml/first")
    assert first.state == "cancelled" and first.reason == "workload deleted"
    assert store.lease(first.lease_id).state == "released"


def test_refusals_reject_the_check_with_the_pools_message(rig, kube):
    store, ctl, _ = rig
    fk.add(kube, fk.workload("ml", "nolabel", [CHECK], {}))
    fk.add(kube, fk.workload("ml", "bad-offer", [CHECK], {**LABELS, kq.OFFER_LABEL: "tpu"}))
    serving = {kq.OFFER_LABEL: "h100", kq.CLASS_LABEL: "inference"}
    fk.add(kube, fk.workload("ml", "serve", [CHECK], serving))
    fk.add(kube, fk.workload("ml", "not-ours", ["other"], LABELS))
    assert Rounds(store, ctl, kube)() == {
        "ml/nolabel": "Rejected",
        "ml/bad-offer": "Rejected",
        "ml/serve": "Rejected",
    }
    assert kq.OFFER_LABEL in check_of(kube, "nolabel")["message"]
    assert "tpu" in check_of(kube, "bad-offer")["message"]
    assert "inference" in check_of(kube, "serve")["message"]
    assert store.kueue_jobs() == []
    # Kueue deactivates a rejected Workload; the pool leaves it be
    assert fk.get(kube, "ml", "serve")["spec"]["active"] is False
    assert Rounds(store, ctl, kube)() == {}


def test_a_workload_without_its_class_label_is_rejected_naming_it(rig, kube):
    store, ctl, _ = rig
    fk.add(kube, fk.workload("ml", "noclass", [CHECK], {kq.OFFER_LABEL: "h100"}))
    bad = {kq.OFFER_LABEL: "h100", kq.CLASS_LABEL: "batch"}
    fk.add(kube, fk.workload("ml", "bad-class", [CHECK], bad))
    assert Rounds(store, ctl, kube)() == {"ml/noclass": "Rejected", "ml/bad-class": "Rejected"}
    message = check_of(kube, "noclass")["message"]
    assert message.startswith("no class:") and kq.CLASS_LABEL in message
    assert "batch" in check_of(kube, "bad-class")["message"]
    assert store.kueue_jobs() == []  # nothing asked of the pool: no class guessed
    # an operator who wants class-less Workloads run as training says so
    fk.add(kube, fk.workload("ml", "noclass-2", [CHECK], {kq.OFFER_LABEL: "h100"}))
    ctl.default_class = "training"
    assert Rounds(store, ctl, kube)() == {"ml/noclass-2": "Ready"}
    assert [j.workload for j in store.kueue_jobs()] == ["training"]


def test_preemption_is_a_notice_then_retry_which_kueue_evicts(rig, kube):
    store, ctl, clock = rig
    rounds = Rounds(store, ctl, kube)
    fk.add(kube, fk.workload("ml", "train", [CHECK], LABELS))
    rounds()
    rounds()  # admitted: running
    job = store.kueue_jobs()[0]
    assert job.state == "running"
    # alice's notebook, within her guarantee, waits for the one GPU: the job gets its notice
    nb = commands.Allocate("alice", "nb", "h100")
    assert rounds(nb, commands.PreemptJobs()) == {"ml/train": "Ready"}
    noticed = store.job(job.id)
    assert noticed.state == "preempting" and "alice" in noticed.reason
    check = check_of(kube, "train")
    assert check["state"] == "Ready" and "preempting, notice until" in check["message"]
    assert cond(kube, "train", "Admitted")  # the pods keep running through the grace
    clock.advance(seconds=119)
    assert rounds() == {}
    # past the class's grace: Retry, which Kueue answers with eviction (SIGTERM to the pods)
    clock.advance(seconds=2)
    assert rounds() == {"ml/train": "Retry"}
    assert cond(kube, "train", "Evicted") and not cond(kube, "train", "Admitted")
    out = rounds()  # the pool sees the eviction: the job is preempted, alice is granted
    assert out["ml/train"] in ("evicted", "Pending")
    ended = store.job(job.id)
    assert ended.state == "preempted" and "alice" in ended.reason
    assert store.lease(job.lease_id).release_reason == "preempted"
    # Kueue queued the Workload again: once alice is served, it waits in the pool's queue
    rounds(commands.Promote())
    alice, _ = store.leases(user="alice")
    assert [x.state for x in alice] == ["granted"]
    again = store.kueue_jobs()
    assert [j.state for j in again] == ["queued"] and again[0].id != job.id
    assert check_of(kube, "train")["state"] == "Pending"
    assert "position 1" in check_of(kube, "train")["message"]


def test_a_job_cancelled_in_the_pool_rejects_its_workload(rig, kube):
    store, ctl, _ = rig
    rounds = Rounds(store, ctl, kube)
    fk.add(kube, fk.workload("ml", "train", [CHECK], LABELS))
    rounds()
    rounds()
    job = store.kueue_jobs()[0]
    assert rounds(commands.CancelJob(job.id)) == {"ml/train": "Rejected"}
    rounds()  # Kueue deactivated and evicted it: the job is cancelled
    ended = store.job(job.id)
    assert ended.state == "cancelled" and ended.reason == "cancelled in the pool"
    assert store.lease(job.lease_id).state == "released"
    assert store.kueue_jobs() == []


def test_a_granted_job_cancelled_in_the_pool_is_evicted_then_rejected(rig, kube):
    store, ctl, _ = rig
    rounds = Rounds(store, ctl, kube)
    fk.add(kube, fk.workload("ml", "train", [CHECK, "other"], LABELS))
    rounds()
    job = store.kueue_jobs()[0]
    assert job.state == "granted"  # Ready, but the other check holds Kueue's admission
    assert rounds(commands.CancelJob(job.id)) == {"ml/train": "Retry"}
    assert store.lease(job.lease_id).state == "released"
    assert rounds() == {"ml/train": "Rejected"}  # asked again: the pool's cancel stands
    assert "cancelled by" in check_of(kube, "train")["message"]
    assert store.kueue_jobs() == []


def test_a_stale_resource_version_is_a_conflict_tried_next_round(rig, kube):
    store, ctl, _ = rig
    fk.add(kube, fk.workload("ml", "train", [CHECK], LABELS))
    Rounds(store, ctl, kube)()
    wl = fk.get(kube, "ml", "train")

    async def stale() -> int | None:
        try:
            await ctl.client().patch_workload_status("ml", "train", wl["status"], "1")
        except KubeError as e:
            return e.status
        finally:
            await ctl.close()
        return None

    assert asyncio.run(stale()) == 409
    assert fk.check_status({"admissionChecks": [{"name": "x", "state": "Done"}]}) is not None


def test_the_charts_rights_are_what_the_controller_calls(db_url, tmp_path):
    """Against an API server enforcing the rendered chart's RBAC: with kueue.enabled the
    controller lists checks and Workloads and patches the status, and nothing is refused;
    without, the pool's service account has no role, the list is refused and nothing changes."""
    pytest.importorskip("helm_python", reason="the test extra's helm-python-sdk")
    from tests.fakekube_rbac import SA_TOKEN, chart_rbac

    upgrade(db_url)
    token = tmp_path / "token"
    token.write_text(SA_TOKEN + "\n")
    from jupyterhub_gpupool.poolconfig import gpu_uuid
    from tests.fakekube_dra import FakeDRA, nvidia_slice

    claimed = {"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpupool-t"}]}
    cases = (
        ({}, "device-plugin", False),
        ({"kueue": {"enabled": True}}, "device-plugin", True),
        ({"kueue": {"enabled": True, "deviceBackend": "dra"}}, "dra", True),
    )
    pool = {**POOL, "nodes": [{"name": "gpu-1", "gpus": [{"model": "H100-80GB", "count": 3}]}]}
    for values, backend, admitted in cases:  # one database: each case's job holds a GPU
        store = make_store(db_url, StoreClock(), pool)
        rbac = chart_rbac(values)
        dra = FakeDRA([nvidia_slice("gpu-1", [{"uuid": gpu_uuid("gpu-1", 0)}])])
        with FakeKubeAPI([kube_node("gpu-1")], authorizer=rbac, dra=dra) as api:
            fk.add(api, fk.admission_check(CHECK, kq.CONTROLLER))
            wl = fk.workload("ml", f"train-{backend}-{admitted}", [CHECK], LABELS)
            wl["spec"]["podSets"][0]["template"]["spec"] = claimed
            fk.add(api, wl)
            ctl = kq.KueueAdmission(
                enabled=True, api_host=api.url, token_file=str(token), device_backend=backend
            )
            out = Rounds(store, ctl, api)()
            made = ("resourceclaims", "ml", "gpupool-t") in api.objects
        assert out.get(f"ml/train-{backend}-{admitted}") == ("Ready" if admitted else None)
        assert made == (backend == "dra")
        assert [(r.verb, r.resource) for _, r in rbac.refused] == (
            [] if admitted else [("list", "admissionchecks")]
        )


def test_with_dra_the_pool_makes_the_workloads_claim_for_the_granted_gpu(db_url, tmp_path):
    """``device_backend = dra``: a Workload whose pod template references a ``gpupool-`` claim
    gets that claim, selecting the granted GPU, before its check is Ready; acting as the Job
    controller, its pod is given that GPU by the fake API server's DRA allocator (not the first
    free one); the claim goes when the Workload finishes. A pool claim shared by a pod set of
    two pods is rejected before the pool is asked."""
    import httpx
    import kubernetes_validate

    from jupyterhub_gpupool.poolconfig import gpu_uuid
    from tests.fakekube_dra import FakeDRA, nvidia_slice

    upgrade(db_url)
    pool = {**POOL, "nodes": [{"name": "gpu-1", "gpus": [{"model": "H100-80GB", "count": 2}]}]}
    store = make_store(db_url, StoreClock(), pool)
    uuids = [gpu_uuid("gpu-1", 0), gpu_uuid("gpu-1", 1)]
    dra = FakeDRA([nvidia_slice("gpu-1", [{"uuid": u} for u in uuids])])
    node = kube_node("gpu-1", gpus=2, product="NVIDIA-H100-80GB-HBM3")
    claimed = {"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpupool-train-2"}]}
    with FakeKubeAPI([node], dra=dra) as kube:
        fk.add(kube, fk.admission_check(CHECK, kq.CONTROLLER))
        token = tmp_path / "token"
        token.write_text(kube.token + "\n")
        ctl = kq.KueueAdmission(
            enabled=True, api_host=kube.url, token_file=str(token), device_backend="dra"
        )
        rounds = Rounds(store, ctl, kube)
        fk.add(kube, fk.workload("ml", "train-1", [CHECK], LABELS))
        assert rounds() == {"ml/train-1": "Ready"}
        wl = fk.workload("ml", "train-2", [CHECK], LABELS)
        wl["spec"]["podSets"][0]["template"]["spec"] = claimed
        fk.add(kube, wl)
        shared = fk.workload("ml", "train-3", [CHECK], LABELS)
        shared["spec"]["podSets"][0].update(count=2, template={"spec": claimed})
        fk.add(kube, shared)
        assert rounds() == {"ml/train-2": "Ready", "ml/train-3": "Rejected"}
        assert "count 1" in check_of(kube, "train-3")["message"]
        job = next(j for j in store.kueue_jobs() if j.name == "ml/train-2")
        assert job.devices[0].gpu == uuids[1], "the test needs the second GPU granted"
        claim = kube.objects[("resourceclaims", "ml", "gpupool-train-2")]
        for version in ("1.34", "1.35"):
            kubernetes_validate.validate(claim, desired_version=version, strict=True)
        assert claim["metadata"]["labels"][kq.LEASE_LABEL] == job.lease_id
        # Kueue admits it; the Job controller's pod, pinned by the podSetUpdates' nodeSelector
        update = check_of(kube, "train-2")["podSetUpdates"][0]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "train-2-x", "namespace": "ml", "labels": update["labels"]},
            "spec": {
                **claimed,
                "nodeSelector": update["nodeSelector"],
                "containers": [
                    {"name": "t", "image": "pytorch", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        }
        r = httpx.post(
            f"{kube.url}/api/v1/namespaces/ml/pods",
            json=pod,
            headers={"Authorization": f"Bearer {kube.token}"},
        )
        assert r.status_code == 201, r.text
        results = kube.objects[("resourceclaims", "ml", "gpupool-train-2")]["status"]
        device = results["allocation"]["devices"]["results"][0]["device"]
        published = dra.initial_slices[0]["spec"]["devices"]
        got = next(d for d in published if d["name"] == device)
        assert got["attributes"]["uuid"] == {"string": uuids[1]}
        # it finishes: the job ends, and its claim is deleted (it waits for its pod to go)
        fk.finish(kube, "ml", "train-2")
        assert rounds()["ml/train-2"] == "finished"
        claim = kube.objects.get(("resourceclaims", "ml", "gpupool-train-2"))
        assert claim is None or claim["metadata"].get("deletionTimestamp")
