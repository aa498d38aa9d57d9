"""Jobs submitted with an image, run by Kubernetes without Kueue: the pool creates a batch/v1
Job (an apps/v1 Deployment for inference) on the fake API server over real HTTP, which refuses
any object kubernetes-validate refuses, and ends the lease as the Job ends."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.kube import kubejobs as kj
from jupyterhub_gpupool.kube.kueue import DEVICES_ANNOTATION, JOB_LABEL, LEASE_LABEL
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.service.writer import BatchWriter
from jupyterhub_gpupool.store.errors import StoreError
from jupyterhub_gpupool.store.read.jobs import JobDevice, JobMig, JobView
from tests import fakekube_apps as fa
from tests.fakes import FakeKubeAPI, StoreClock, kube_node, make_store

pytest.importorskip("kubernetes_validate")

POOL: dict[str, Any] = {
    "nodes": [{"name": "gpu-1", "gpus": [{"model": "H100-80GB", "count": 2}]}],
    "offers": [{"name": "h100", "kind": "gpu", "models": ["H100-80GB"]}],
    "quotas": {
        "default": {"guarantee": 0, "limit": 2},
        "users": {"alice": {"guarantee": 2, "limit": 2}},
    },
    "classes": {"training": {"grace": 60}},
}
NS = "gpu-jobs"


@pytest.fixture
def rig(db_url: str, tmp_path: Path):
    upgrade(db_url)
    clock = StoreClock()
    store = make_store(db_url, clock, POOL)
    with FakeKubeAPI([kube_node("gpu-1", gpus=2)]) as kube:
        token = tmp_path / "token"
        token.write_text(kube.token + "\n")
        runner = kj.KubeJobs(enabled=True, api_host=kube.url, token_file=str(token), namespace=NS)
        yield store, runner, kube, clock


def rounds(store: Any, runner: kj.KubeJobs, *extra: commands.Command) -> dict[str, str]:
    async def go() -> dict[str, str]:
        writer = BatchWriter(store)
        writer.start()
        try:
            for c in extra:
                await writer.run(c)
            return await runner.step(store, writer.run)
        finally:
            writer.stop()
            await runner.close()

    return asyncio.run(go())


def submit(store: Any, user: str = "bob", workload: str = "training") -> JobView:
    return store.submit_job(user, "h100", ["python", "train.py"], workload, image="pytorch:25.01")


def test_a_granted_job_becomes_a_pinned_batch_job_and_ends_with_it(rig):
    store, runner, kube, _ = rig
    job = submit(store)
    assert job.runner == "kubernetes" and job.runner_ref == {"image": "pytorch:25.01"}
    assert store.node_jobs("gpu-1") == []  # the local runner never sees it
    assert rounds(store, runner) == {job.id: "created"}
    name = kj.object_name(job.id)
    made = kube.objects[("jobs", NS, name)]
    assert fa.problems(made) is None
    pod = made["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "gpu-1"}
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert pod["containers"][0]["command"] == ["python", "train.py"]
    assert made["metadata"]["labels"][LEASE_LABEL] == job.lease_id
    assert made["metadata"]["labels"][JOB_LABEL] == job.id
    assert made["metadata"]["annotations"][DEVICES_ANNOTATION] == job.devices[0].gpu
    assert rounds(store, runner) == {}  # created once
    fa.job_runs(kube, NS, name)
    assert rounds(store, runner) == {job.id: "running"}
    store.clock.advance(hours=1)
    store.reconcile(set())  # no runner heartbeat needed
    assert store.job(job.id).state == "running"
    fa.job_ends(kube, NS, name, ok=True)
    assert rounds(store, runner) == {job.id: "succeeded"}
    assert store.job(job.id).state == "succeeded"
    assert store.lease(job.lease_id).state == "released"


def test_a_failed_job_fails_and_inference_is_a_deployment(rig):
    store, runner, kube, _ = rig
    train, serve = submit(store), submit(store, workload="inference")
    assert rounds(store, runner) == {train.id: "created", serve.id: "created"}
    dep = kube.objects[("deployments", NS, kj.object_name(serve.id))]
    assert fa.problems(dep) is None
    assert dep["spec"]["template"]["spec"]["restartPolicy"] == "Always"
    fa.job_ends(kube, NS, kj.object_name(train.id), ok=False)
    fa.deployment_available(kube, NS, kj.object_name(serve.id))
    assert rounds(store, runner) == {train.id: "failed", serve.id: "running"}
    # cancelling the inference job deletes its Deployment
    assert rounds(store, runner, commands.CancelJob(serve.id)) == {serve.id: "cancelled"}
    assert ("deployments", NS, kj.object_name(serve.id)) not in kube.objects
    assert store.job(serve.id).state == "cancelled"


def test_preemption_deletes_the_job_at_the_notice_deadline(rig):
    store, runner, kube, clock = rig
    jobs = [submit(store), submit(store)]
    rounds(store, runner)
    for j in jobs:
        fa.job_runs(kube, NS, kj.object_name(j.id))
    rounds(store, runner)
    clock.advance(seconds=5)
    nb = commands.Allocate("alice", "nb", "h100")
    rounds(store, runner, nb, commands.PreemptJobs())
    noticed = [j for j in jobs if store.job(j.id).state == "preempting"]
    assert len(noticed) == 1
    victim = noticed[0]
    clock.advance(seconds=59)
    assert rounds(store, runner) == {}  # the notice runs: the pod keeps running
    clock.advance(seconds=2)
    assert rounds(store, runner) == {victim.id: "preempted"}
    assert ("jobs", NS, kj.object_name(victim.id)) not in kube.objects
    assert store.job(victim.id).state == "preempted"
    assert store.lease(victim.lease_id).release_reason == "preempted"


def test_an_admins_release_deletes_the_object_and_a_bad_image_is_refused(rig):
    store, runner, kube, _ = rig
    job = submit(store)
    rounds(store, runner)
    rounds(store, runner, commands.Release(job.lease_id))
    assert ("jobs", NS, kj.object_name(job.id)) not in kube.objects
    with pytest.raises(StoreError) as info:
        store.submit_job("bob", "h100", ["x"], image="bad image")
    assert info.value.code == "invalid_image"


def test_the_charts_role_is_what_the_runner_calls(db_url, tmp_path):
    """Against an API server enforcing the rendered chart's RBAC: with kubeJobs.enabled the
    Role in the jobs' namespace lets the round list, create and delete; without, the list is
    refused and nothing is created. With deviceBackend dra it also covers the jobs' claims;
    a runner in dra mode under the device-plugin Role is refused the claims."""
    pytest.importorskip("helm_python", reason="the test extra's helm-python-sdk")
    from jupyterhub_gpupool.poolconfig import gpu_uuid
    from tests.fakekube_dra import FakeDRA, nvidia_slice
    from tests.fakekube_rbac import SA_TOKEN, chart_rbac

    upgrade(db_url)
    token = tmp_path / "token"
    token.write_text(SA_TOKEN + "\n")
    on = {"enabled": True, "namespace": NS}
    claims = [("list", "resourceclaims"), ("create", "resourceclaims")]
    cases = (
        ({}, "device-plugin", False, [("list", "jobs"), ("list", "jobs")]),
        ({"kubeJobs": on}, "device-plugin", True, []),
        ({"kubeJobs": {**on, "deviceBackend": "dra"}}, "dra", True, []),
        ({"kubeJobs": on}, "dra", False, claims),
    )
    for values, backend, allowed, refusals in cases:
        store = make_store(db_url, StoreClock(), POOL)
        rbac = chart_rbac(values)
        dra = FakeDRA([nvidia_slice("gpu-1", [{"uuid": gpu_uuid("gpu-1", i)} for i in (0, 1)])])
        with FakeKubeAPI([kube_node("gpu-1", gpus=2)], authorizer=rbac, dra=dra) as api:
            runner = kj.KubeJobs(
                api_host=api.url, token_file=str(token), namespace=NS, device_backend=backend
            )
            job = submit(store)
            assert rounds(store, runner) == ({job.id: "created"} if allowed else {})
            rounds(store, runner, commands.CancelJob(job.id))
            assert ("jobs", NS, kj.object_name(job.id)) not in api.objects
            assert ("resourceclaims", NS, kj.object_name(job.id)) not in api.objects
        refused = [(r.verb, r.resource) for _, r in rbac.refused]
        assert refused[: len(refusals)] == refusals, (values, backend, refused)
        assert set(refused) == set(refusals), (values, backend, refused)


def test_mig_instances_are_asked_by_profile_and_the_manifest_validates():
    mig = "1g.10gb"
    job = JobView(
        id="a" * 32, user="bob", group=None, name="", offer="a100-1g", workload="training",
        replicas=1, command=(), cwd=None, state="granted", position=None, lease_id="l1",
        node="gpu-2",
        devices=(
            JobDevice("GPU-1", 0, JobMig(mig, 0, None)),
            JobDevice("GPU-1", 0, JobMig(mig, 1, "MIG-2")),
        ),
        created=None, started=None, ended=None, exit_code=None, notice_deadline=None,
        reason=None, runner="kubernetes", runner_ref={"image": "pytorch:25.01"},
        env={"SEED": "1"},
    )  # fmt: skip
    body = kj.manifest(job, NS, "example.com/node")
    container = body["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "2"}
    assert "command" not in container  # the image's entrypoint
    assert container["env"] == [
        {"name": "SEED", "value": "1"},
        {"name": "GPUPOOL_JOB_ID", "value": job.id},
    ]
    assert body["metadata"]["annotations"][DEVICES_ANNOTATION] == "GPU-1,MIG-2"
    assert body["spec"]["template"]["spec"]["nodeSelector"] == {"example.com/node": "gpu-2"}
    assert fa.problems(body) is None
    broken = {**body, "spec": {**body["spec"], "backoffLimit": "none"}}
    assert fa.problems(broken) is not None  # the check does refuse a bad object


def test_with_dra_the_job_gets_exactly_the_granted_gpu(db_url, tmp_path):
    """``device_backend = dra``: the pool makes a ResourceClaim selecting the granted GPU by
    uuid; acting as the Job controller, a pod from the Job's template is scheduled by the fake
    API server's DRA allocator, which gives it that GPU and not the first free one; the claim
    goes when the job ends."""
    import httpx
    import kubernetes_validate

    from jupyterhub_gpupool.poolconfig import gpu_uuid
    from tests.fakekube_dra import FakeDRA, nvidia_slice

    upgrade(db_url)
    store = make_store(db_url, StoreClock(), POOL)
    uuids = [gpu_uuid("gpu-1", 0), gpu_uuid("gpu-1", 1)]
    dra = FakeDRA([nvidia_slice("gpu-1", [{"uuid": u} for u in uuids])])
    with FakeKubeAPI([kube_node("gpu-1", gpus=2)], dra=dra) as kube:
        token = tmp_path / "token"
        token.write_text(kube.token + "\n")
        runner = kj.KubeJobs(
            api_host=kube.url, token_file=str(token), namespace=NS, device_backend="dra"
        )
        first, second = submit(store), submit(store)
        granted = second.devices[0].gpu
        assert granted == uuids[1], "the test needs the second job on the second GPU"
        assert rounds(store, runner) == {first.id: "created", second.id: "created"}
        name = kj.object_name(second.id)
        claim = kube.objects[("resourceclaims", NS, name)]
        for version in ("1.34", "1.35"):
            kubernetes_validate.validate(claim, desired_version=version, strict=True)
        made = kube.objects[("jobs", NS, name)]
        assert fa.problems(made) is None
        pod = made["spec"]["template"]["spec"]
        assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimName": name}]
        assert pod["containers"][0]["resources"] == {"claims": [{"name": "gpu"}]}
        # the Job controller's pod, from the template (the first job's pod is not made yet)
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-x",
                "namespace": NS,
                **made["spec"]["template"]["metadata"],
            },
            "spec": pod,
        }
        r = httpx.post(
            f"{kube.url}/api/v1/namespaces/{NS}/pods",
            json=body,
            headers={"Authorization": f"Bearer {kube.token}"},
        )
        assert r.status_code == 201, r.text
        results = kube.objects[("resourceclaims", NS, name)]["status"]["allocation"]["devices"]
        got = [
            d
            for d in dra.initial_slices[0]["spec"]["devices"]
            if d["name"] == results["results"][0]["device"]
        ]
        assert got[0]["attributes"]["uuid"] == {"string": granted}
        # the job ends: its claim is deleted with it
        fa.job_ends(kube, NS, name, ok=True)
        assert rounds(store, runner)[second.id] == "succeeded"
        claim = kube.objects.get(("resourceclaims", NS, name))
        assert claim is None or claim["metadata"].get("deletionTimestamp")
        # a cancelled job's claim goes with its Job
        rounds(store, runner, commands.CancelJob(first.id))
        assert ("resourceclaims", NS, kj.object_name(first.id)) not in kube.objects


def test_inference_replicas_are_a_deployment_of_that_many_pods_of_one_copy_each(rig):
    store, runner, kube, _ = rig
    serve = store.submit_job("alice", "h100", ["serve"], "inference", image="vllm:0.6", replicas=2)
    assert serve.replicas == 2 and len(serve.devices) == 2
    assert rounds(store, runner) == {serve.id: "created"}
    dep = kube.objects[("deployments", NS, kj.object_name(serve.id))]
    assert fa.problems(dep) is None
    assert dep["spec"]["replicas"] == 2
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}  # one copy's GPU
    assert len(dep["metadata"]["annotations"][DEVICES_ANNOTATION].split(",")) == 2
