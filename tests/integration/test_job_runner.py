"""Jobs end to end on the real hub and pool service: the local runner, the CLI, the Python API.

The runner's rounds are driven by the test (``RunnerLoop.step``), with an injectable clock for
its SIGKILL deadlines; everything else is real: the service over HTTP with hub tokens, the
job's process, its signals, its log, the notice file.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from jupyterhub_gpupool import jobs
from jupyterhub_gpupool.jobs.runner import RunnerLoop
from jupyterhub_gpupool.poolclient import PoolClient, PoolRefused
from tests.fakes import HubEnv, request, wait_until, write_pool

#: Two H100s; everyone's guarantee is one GPU, the limit two: a second training job borrows,
#: and another user's first GPU is within guarantee.
POOL = """
nodes:
  - name: box
    gpus:
      - {model: H100-80GB, count: 2}
offers:
  - {name: h100, kind: gpu, count: 1, models: [H100-80GB], display_name: "1x H100"}
quotas:
  default: {guarantee: 1, limit: 2}
"""


@pytest.fixture
def env(tmp_path: Path, sqlite_url: str):
    hub = HubEnv(tmp_path, sqlite_url, write_pool(tmp_path, POOL), users=("alice", "bob", "admin"))
    with hub.running():
        yield hub


class Clock:
    """The runner's wall clock, moved by the test past a deadline instead of waiting for it."""

    def __init__(self) -> None:
        self.skew = 0.0

    def __call__(self) -> float:
        return time.time() + self.skew


def runner(env: HubEnv, tmp_path: Path, clock: Clock | None = None) -> RunnerLoop:
    return RunnerLoop(
        PoolClient(env.api, env.agent_token),
        "box",
        tmp_path / "jobs",
        clock=clock or time.time,
        cancel_grace=5.0,
    )


def script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def rounds(loop: RunnerLoop, done, what: str) -> Any:
    """Runner rounds (each a fresh event loop's worth, as the app runs them) until ``done()``."""

    def step() -> Any:
        asyncio.run(loop.step())
        return done()

    return wait_until(step, what=what, step=0.05)


def job_of(env: HubEnv, token: str, job_id: str) -> dict[str, Any]:
    r = request("GET", f"{env.api}/jobs/{job_id}", token)
    assert r.status == 200, r.body
    return r.json()  # type: ignore[return-value]


def submit(env: HubEnv, token: str, command: list[str], **body: Any) -> dict[str, Any]:
    r = request("POST", f"{env.api}/jobs", token, {"offer": "h100", "command": command, **body})
    assert r.status == 201, r.body
    return r.json()  # type: ignore[return-value]


def test_a_job_runs_on_its_granted_gpu_and_gives_it_back(env, tmp_path):
    alice = env.token("alice")
    cmd = script(
        tmp_path,
        "show.py",
        """
        import os
        print("devices", os.environ["CUDA_VISIBLE_DEVICES"], os.environ["GPUPOOL_JOB_ID"])
        """,
    )
    job = submit(env, alice, cmd, name="show")
    loop = runner(env, tmp_path)
    done = rounds(
        loop,
        lambda: job_of(env, alice, job["id"])["state"] in ("succeeded", "failed"),
        "the job ends",
    )
    assert done
    final = job_of(env, alice, job["id"])
    assert final["state"] == "succeeded" and final["exit_code"] == 0, final
    lease = request("GET", f"{env.api}/allocations/{final['lease_id']}", alice).json()
    assert lease["state"] == "released", lease
    (gpu,) = {s["gpu"] for s in lease["slots"]}
    logs = request("GET", f"{env.api}/jobs/{job['id']}/logs", alice).json()
    assert logs["data"].strip() == f"devices {gpu} {job['id']}", logs
    # a failing command fails the job with its status; one that cannot start, with 127
    bad = submit(env, alice, [sys.executable, "-c", "raise SystemExit(3)"])
    missing = submit(env, alice, [str(tmp_path / "no-such-program")])
    rounds(
        loop,
        lambda: all(job_of(env, alice, j["id"])["state"] == "failed" for j in (bad, missing)),
        "both jobs fail",
    )
    assert job_of(env, alice, bad["id"])["exit_code"] == 3
    assert job_of(env, alice, missing["id"])["exit_code"] == 127
    text = request("GET", f"{env.api}/jobs/{missing['id']}/logs", alice).json()["data"]
    assert "could not start" in text


def test_cancel_stops_a_running_job_and_kills_it_after_the_grace(env, tmp_path):
    alice = env.token("alice")
    cmd = script(
        tmp_path,
        "stubborn.py",
        """
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: print("term ignored", flush=True))
        print("started", flush=True)
        while True:
            time.sleep(0.1)
        """,
    )
    job = submit(env, alice, cmd)
    clock = Clock()
    loop = runner(env, tmp_path, clock)
    rounds(
        loop,
        lambda: (
            "started" in (tmp_path / "jobs" / job["id"] / "output.log").read_text()
            if (tmp_path / "jobs" / job["id"] / "output.log").exists()
            else False
        ),
        "it runs",
    )
    r = request("DELETE", f"{env.api}/jobs/{job['id']}", alice)
    assert r.status == 200 and r.json()["state"] == "cancelling", r.body
    log = tmp_path / "jobs" / job["id"] / "output.log"
    rounds(loop, lambda: "term ignored" in log.read_text(), "SIGTERM reaches it")
    assert job_of(env, alice, job["id"])["state"] == "cancelling"
    clock.skew = 6.0  # past cancel_grace: SIGKILL
    rounds(loop, lambda: job_of(env, alice, job["id"])["state"] == "cancelled", "cancelled")
    final = job_of(env, alice, job["id"])
    assert final["exit_code"] == -9, final
    lease = request("GET", f"{env.api}/allocations/{final['lease_id']}", alice).json()
    assert lease["state"] == "released"


def test_a_training_job_is_preempted_with_its_notice_for_a_user_within_guarantee(env, tmp_path):
    """Alice's two training jobs hold both H100s (the second borrowed); Bob's server asks for
    one within his guarantee: a job gets SIGTERM and the notice file, checkpoints, exits, and
    Bob is granted."""
    alice, admin = env.token("alice"), env.token("admin")
    cmd = script(
        tmp_path,
        "train.py",
        """
        import json, os, signal, sys, time
        def stop(*_):
            notice = json.load(open(os.environ["GPUPOOL_PREEMPT_NOTICE"]))
            print("checkpoint before", notice["deadline"], flush=True)
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("training", flush=True)
        while True:
            time.sleep(0.1)
        """,
    )
    first, second = (submit(env, alice, cmd, name=f"train-{i}") for i in range(2))
    loop = runner(env, tmp_path)
    rounds(
        loop,
        lambda: all(job_of(env, alice, j["id"])["state"] == "running" for j in (first, second)),
        "both jobs run",
    )
    ask = {"user": "bob", "server": "", "offer": "h100"}
    r = request("POST", f"{env.api}/allocations", env.spawner_token, ask)
    assert r.status in (200, 201, 202), r.body
    bob = r.json()
    assert bob["state"] == "queued", bob
    preempted = wait_until(
        lambda: [
            j for j in (first, second) if job_of(env, alice, j["id"])["state"] == "preempting"
        ],
        what="a training job told to stop",
    )
    assert len(preempted) == 1
    victim = job_of(env, alice, preempted[0]["id"])
    assert victim["notice_deadline"], victim
    rounds(
        loop,
        lambda: job_of(env, alice, victim["id"])["state"] == "preempted",
        "the job checkpoints and exits",
    )
    log = request("GET", f"{env.api}/jobs/{victim['id']}/logs", alice).json()["data"]
    assert f"checkpoint before {victim['notice_deadline']}" in log, log
    lease = wait_until(
        lambda: (
            b
            if (b := request("GET", f"{env.api}/allocations/{bob['id']}", admin).json())["state"]
            == "granted"
            else None
        ),
        what="Bob granted",
    )
    assert lease["state"] == "granted"
    other = first if victim["id"] == second["id"] else second
    assert job_of(env, alice, other["id"])["state"] == "running"
    asyncio.run(loop.close())


def test_the_cli_submits_lists_follows_and_cancels(env, tmp_path):
    alice = env.token("alice")
    run_env = {**os.environ, "GPUPOOL_API_URL": env.api, "JUPYTERHUB_API_TOKEN": alice}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "jupyterhub_gpupool.cli", "job", *args],
            env=run_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    out = cli("submit", "--offer", "h100", "--name", "hello", "--", "echo", "hi there")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("submitted ") and " hello h100 training " in out.stdout
    job_id = out.stdout.split()[1]
    listed = cli("list")
    assert listed.returncode == 0 and job_id in listed.stdout, listed
    loop = runner(env, tmp_path)
    rounds(loop, lambda: job_of(env, alice, job_id)["state"] == "succeeded", "it runs")
    logs = cli("logs", job_id, "--follow")
    assert logs.returncode == 0 and logs.stdout == "hi there\n", logs
    # it runs in the folder it was submitted from
    here = cli("submit", "--offer", "h100", "--json", "--", "pwd")
    where = json.loads(here.stdout)
    assert where["cwd"] == str(tmp_path)
    rounds(loop, lambda: job_of(env, alice, where["id"])["state"] == "succeeded", "pwd runs")
    assert cli("logs", where["id"]).stdout == f"{tmp_path}\n"
    # bad input: one line on stderr, exit status 1, nothing submitted
    before = len(json.loads(cli("list", "--json").stdout))
    for args, words in (
        (("submit", "--offer", "nope", "--", "true"), "nope"),
        (("submit", "--offer", "h100"), "no command"),
        (("submit", "--offer", "h100", "--class", "fancy", "--", "true"), "fancy"),
        (("submit", "--offer", "h100", "--env", "oops", "--", "true"), "KEY=VALUE"),
    ):
        bad = cli(*args)
        assert bad.returncode == 1, (args, bad)
        assert len(bad.stderr.strip().splitlines()) == 1 and words in bad.stderr, bad.stderr
    assert len(json.loads(cli("list", "--json").stdout)) == before
    other = cli("cancel", job_id)
    assert other.returncode in (0, 1)  # an ended job: cancelling it says so, in one line
    assert len((other.stdout + other.stderr).strip().splitlines()) == 1


def test_the_python_api_works_inside_a_running_event_loop(env, tmp_path):
    """As in a notebook, whose kernel runs an event loop: the calls still block and answer."""
    alice = env.token("alice")
    client = jobs.connect(env.api, alice)

    async def notebook_cell() -> jobs.Job:
        job = jobs.submit(["echo", "from a notebook"], offer="h100", name="nb", client=client)
        assert job.status() in ("queued", "granted")
        return job

    job = asyncio.run(notebook_cell())
    loop = runner(env, tmp_path)
    rounds(loop, lambda: job.status() == "succeeded", "the notebook's job ends")
    assert job.logs() == "from a notebook\n"
    assert [j.id for j in jobs.list_jobs(client=client)] == [job.id]
    with pytest.raises(PoolRefused) as refused:
        jobs.submit(["true"], offer="nope", client=client)
    assert (refused.value.status, refused.value.code) == (422, "unknown_offer")
    with pytest.raises(PoolRefused) as refused:
        jobs.submit(["true"], offer="h100", cwd="relative/path", client=client)
    assert (refused.value.status, refused.value.field) == (422, "cwd")
