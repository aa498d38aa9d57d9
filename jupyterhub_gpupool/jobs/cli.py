"""Submit, list, follow and cancel the pool's jobs from a terminal (``jupyterhub-gpupool job``).

In a pool-spawned server's terminal it needs nothing else: the pool's API is
``$GPUPOOL_API_URL`` and the token the server's own ``$JUPYTERHUB_API_TOKEN``; elsewhere pass
``--pool-url`` and set ``$JUPYTERHUB_API_TOKEN`` (a token from the hub's token page with the
``custom:gpupool:use`` scope). A refusal is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from ..poolclient import PoolClient, PoolClientError
from . import connect


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``job`` subcommands."""
    parser.add_argument(
        "--pool-url",
        default=None,
        help="the pool's API, e.g. http://hub:8000/services/gpupool/api/v1/ (default: "
        "$GPUPOOL_API_URL)",
    )
    sub = parser.add_subparsers(dest="action", metavar="ACTION", parser_class=type(parser))
    sub.required = True
    s = sub.add_parser(
        "submit",
        help="run a command on a GPU of the pool",
        description="Run COMMAND as a job on OFFER: `job submit --offer a100-3g -- python "
        "train.py`. It runs from this folder (on one machine) with CUDA_VISIBLE_DEVICES set to "
        "the granted device.",
    )
    s.add_argument("--offer", required=True, help="the offer (as the spawn page lists them)")
    s.add_argument(
        "--class",
        dest="workload",
        default="training",
        help="workload class: training (default: preemptible, with a notice), inference, "
        "or any class the pool config defines",
    )
    s.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="N",
        help="copies of a whole-GPU offer (class inference; all count against your quota); "
        "default 1",
    )
    s.add_argument("--name", help="a name to know it by (shown in lists and bills)")
    s.add_argument("--group", help="the group whose quota it uses (default: the pool's choice)")
    s.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for the job (repeatable)",
    )
    s.add_argument("--json", action="store_true", help="print the job's JSON")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command and its args")
    ls = sub.add_parser("list", help="your jobs (an administrator's token: everyone's)")
    ls.add_argument("--state", help="only jobs in this state (queued, running, ...)")
    ls.add_argument("--json", action="store_true", help="print the jobs' JSON")
    st = sub.add_parser("status", help="one job's state")
    st.add_argument("id")
    st.add_argument("--json", action="store_true", help="print the job's JSON")
    lg = sub.add_parser("logs", help="a job's output")
    lg.add_argument("id")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    cn = sub.add_parser("cancel", help="cancel a job (a running one is stopped)")
    cn.add_argument("id")
    parser.set_defaults(func=run_cli)


def _env(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env {pair!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _line(job: dict[str, Any]) -> str:
    where = f" on {job['node']}" if job.get("node") else ""
    pos = f" (position {job['position']})" if job.get("position") else ""
    code = f" exit {job['exit_code']}" if job.get("exit_code") is not None else ""
    name = f" {job['name']}" if job.get("name") else ""
    return (
        f"{job['id']}{name} {job.get('offer')} {job.get('class')} {job['state']}{pos}{where}{code}"
    )


async def _main(args: argparse.Namespace, client: PoolClient) -> int:
    if args.action == "submit":
        command = list(args.command)
        if command[:1] == ["--"]:
            command = command[1:]
        if not command:
            raise ValueError("no command: `job submit --offer OFFER -- COMMAND [ARGS...]`")
        job = await client.submit_job(
            args.offer,
            command,
            workload=args.workload,
            name=args.name,
            group=args.group,
            env=_env(args.env) or None,
            cwd=os.getcwd(),
            replicas=args.replicas,
        )
        print(json.dumps(job, indent=2) if args.json else f"submitted {_line(job)}")
        return 0
    if args.action == "list":
        jobs = await client.jobs(state=args.state)
        if args.json:
            print(json.dumps(jobs, indent=2))
        for job in [] if args.json else jobs:
            print(_line(job))
        return 0
    if args.action == "status":
        job = await client.job(args.id)
        print(json.dumps(job, indent=2) if args.json else _line(job))
        return 0
    if args.action == "cancel":
        job = await client.cancel_job(args.id)
        print(_line(job))
        return 0
    # logs
    at = 0
    while True:
        part = await client.job_logs(args.id, at)
        data = str(part.get("data") or "")
        if data:
            sys.stdout.write(data)
            sys.stdout.flush()
        nxt = int(part.get("next", at))
        if not args.follow or (part.get("complete") and nxt <= at):
            return 0
        if nxt <= at:
            await asyncio.sleep(2.0)
        at = nxt


def run_cli(args: argparse.Namespace) -> int:
    """Run one ``job`` action; a refusal or an unreachable pool is one line and exit 1."""
    try:
        client = connect(args.pool_url)
        return asyncio.run(_main(args, client))
    except PoolClientError as e:
        print(f"jupyterhub-gpupool job: error: {e.message}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"jupyterhub-gpupool job: error: {e}", file=sys.stderr)
        return 1
