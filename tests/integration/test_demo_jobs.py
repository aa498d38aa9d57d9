"""The demo runs jobs: a training job takes the idle H100 and is preempted, with its notice, when
another user starts a server within guarantee (issue 35's demo).

Everything is the demo's own: ``jupyterhub-gpupool demo`` with the tutorial's pool (one H100),
its hub-managed job runner, the ``job`` CLI with alice's token as in her terminal, and bob's
server started through the hub's REST API as the spawn page does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.demoproc import START_PATIENCE, Launched, finish, launch, tree, user_token
from tests.fakes import request, wait_until

pytestmark = pytest.mark.slow

TRAIN = """
import json, os, signal, sys, time

def checkpoint(*_):
    notice = json.load(open(os.environ["GPUPOOL_PREEMPT_NOTICE"]))
    print("checkpoint saved before", notice["deadline"], flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, checkpoint)
print("training on", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
while True:
    time.sleep(0.2)
"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    launched = launch(tmp_path_factory.mktemp("jobs-demo"))
    try:
        yield launched
    finally:
        finish(launched)


def test_a_training_job_borrows_the_idle_gpu_and_is_preempted_for_a_server(demo, tmp_path):
    api = f"{demo.url}/services/gpupool/api/v1/"
    alice = user_token(demo.url, "alice")
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    terminal = {**os.environ, "GPUPOOL_API_URL": api, "JUPYTERHUB_API_TOKEN": alice}

    def job(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "jupyterhub_gpupool.cli", "job", *args],
            env=terminal,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def status(job_id: str) -> dict:
        out = job("status", job_id, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert any("job-runner" in cmd for cmd in tree(demo.proc.pid).values()), "no job runner"
    submitted = job("submit", "--offer", "h100", "--name", "resnet", "--", "python", "train.py")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[1]
    wait_until(
        lambda: status(job_id)["state"] == "running",
        START_PATIENCE,
        "the demo's runner starts the job",
        step=0.5,
        info=demo.logs,
    )
    (device,) = [d["gpu"] for d in status(job_id)["devices"]]
    wait_until(lambda: f"training on {device}" in job("logs", job_id).stdout, what="its output")

    # bob starts a server on the H100, within his guarantee: the training job must make room
    bob = user_token(demo.url, "bob")
    hub_api = f"{demo.url}/hub/api/users/bob"
    r = request("POST", f"{hub_api}/server", bob, {"user_options": {"gpupool_offer": "h100"}})
    assert r.status in (201, 202), r.body
    notice = wait_until(
        lambda: (s := status(job_id))["state"] in ("preempting", "preempted") and s,
        START_PATIENCE,
        "the training job told to make room",
        step=0.5,
        info=demo.logs,
    )
    assert notice["notice_deadline"], notice
    wait_until(
        lambda: status(job_id)["state"] == "preempted",
        START_PATIENCE,
        "the job checkpoints and exits",
        step=0.5,
        info=demo.logs,
    )
    logs = job("logs", job_id).stdout
    assert f"checkpoint saved before {notice['notice_deadline']}" in logs, logs

    def bob_ready() -> bool:
        servers = request("GET", hub_api, bob).json().get("servers") or {}
        return bool(servers.get("", {}).get("ready"))

    wait_until(bob_ready, START_PATIENCE, "bob's server on the H100", step=0.5, info=demo.logs)
    leases = request("GET", f"{api}allocations?user=bob", bob).json()["items"]
    assert [(le["state"], le["slots"][0]["gpu"]) for le in leases] == [("active", device)]
    listed = job("list")
    assert f"{job_id} resnet h100 training preempted" in listed.stdout, listed.stdout
    assert Path(tmp_path / "train.py").exists()
