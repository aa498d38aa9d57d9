"""``jupyterhub-gpupool``: one command, one subcommand per part.

Subcommands that are full applications (service, agent, reclaimer) are traitlets apps and get
their own argv; the rest are small argparse commands. Bad flags exit 2 with one line.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from ._version import __version__


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree (also used by the docs' CLI reference)."""
    from .simulate import kernels as kernels_sim
    from .simulate import mixed as mixed_sim
    from .simulate import reclaim as reclaim_sim
    from .simulate import whatif

    parser = _Parser(
        prog="jupyterhub-gpupool",
        description="A self-service GPU pool for JupyterHub.",
    )
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    from . import demo

    dm = sub.add_parser(
        "demo",
        help="run JupyterHub with the pool on simulated GPUs (or this machine's real ones)",
        description=demo.__doc__.splitlines()[0] if demo.__doc__ else None,
    )
    demo.add_arguments(dm)
    dm.set_defaults(func=demo.run_cli)

    svc = sub.add_parser(
        "service", help="run the pool service (a JupyterHub service)", add_help=False
    )
    svc.set_defaults(func=_run_app("jupyterhub_gpupool.service.app", "PoolService"))
    ag = sub.add_parser(
        "agent", help="run a node agent (GPU inventory and utilization)", add_help=False
    )
    ag.set_defaults(func=_run_app("jupyterhub_gpupool.telemetry.agent", "NodeAgent"))
    rc = sub.add_parser(
        "reclaimer",
        help="run the idle-GPU reclaimer (a JupyterHub service beside the pool)",
        add_help=False,
    )
    rc.set_defaults(func=_run_app("jupyterhub_gpupool.reclaim.app", "ReclaimerApp"))
    from .jobs import cli as job_cli

    jb = sub.add_parser(
        "job",
        help="submit, list, follow and cancel training and inference jobs",
        description=job_cli.__doc__.splitlines()[0] if job_cli.__doc__ else None,
    )
    job_cli.add_arguments(jb)
    ks = sub.add_parser(
        "kernelspecs",
        help="write the 'Python 3 (GPU: <offer>)' kernelspecs of the offers you may use",
    )
    ks.add_argument("--dir", help="kernelspec folder (default: your Jupyter data dir's kernels)")
    ks.add_argument("--api-url", default=os.environ.get("GPUPOOL_API_URL", ""),
                    help="the pool's API (default: $GPUPOOL_API_URL)")  # fmt: skip
    ks.add_argument("--token", default=os.environ.get("JUPYTERHUB_API_TOKEN", ""),
                    help="the pool token (default: $JUPYTERHUB_API_TOKEN)")  # fmt: skip
    ks.set_defaults(func=_kernelspecs)
    jr = sub.add_parser(
        "job-runner",
        help="run the pool's granted jobs on this machine (beside the node agent)",
        add_help=False,
    )
    jr.set_defaults(func=_run_app("jupyterhub_gpupool.jobs.app", "JobRunner"))
    up = sub.add_parser("upgrade-db", help="create or migrate the pool database")
    up.add_argument(
        "--db-url",
        default=os.environ.get("GPUPOOL_DB_URL") or "sqlite:///jupyterhub-gpupool.sqlite",
        help="SQLAlchemy URL of the pool database (default: $GPUPOOL_DB_URL, else "
        "sqlite:///jupyterhub-gpupool.sqlite). Safe beside running services and other "
        "upgrade-db runs: one migrator at a time (a PostgreSQL advisory lock)",
    )
    up.set_defaults(func=_upgrade_db)

    from . import report

    rp = sub.add_parser(
        "report",
        help="the monthly GPU usage and cost report (CSV or HTML) from the pool database",
        description=report.__doc__.splitlines()[0] if report.__doc__ else None,
    )
    report.add_arguments(rp)
    rp.set_defaults(func=report.run_cli)

    sim = sub.add_parser(
        "simulate", help="replay traces or the recorded requests through the pool's rules"
    )
    sim_sub = sim.add_subparsers(dest="experiment", metavar="EXPERIMENT", parser_class=_Parser)
    sim_sub.required = True
    packing_help = "the FGD paper's packing experiment (workload tuned to 130%% of capacity)"
    if importlib.util.find_spec("numpy") is None:  # the `simulate` extra is not installed
        # every flag is taken as it is (no option prefix): the answer is the missing extra
        pack = sim_sub.add_parser("packing", help=packing_help, add_help=False, prefix_chars="\0")
        pack.add_argument("rest", nargs="*")
        pack.set_defaults(func=_needs("numpy", "jupyterhub-gpupool simulate packing"))
    else:
        from .simulate import packing

        pack = sim_sub.add_parser(
            "packing",
            help=packing_help,
            description=packing.__doc__.splitlines()[0] if packing.__doc__ else None,
        )
        packing.add_arguments(pack)
        pack.set_defaults(func=packing.run_cli)
    rec = sim_sub.add_parser(
        "reclaim",
        help="a day of notebook sessions under four idle-reclaim rules (40 GPUs, 200 users)",
        description=reclaim_sim.__doc__.splitlines()[0] if reclaim_sim.__doc__ else None,
    )
    reclaim_sim.add_arguments(rec)
    rec.set_defaults(func=reclaim_sim.run_cli)
    ker = sim_sub.add_parser(
        "kernels",
        help="the same day with server-level against kernel-level GPU leases (NotebookOS-style)",
        description=kernels_sim.__doc__.splitlines()[0] if kernels_sim.__doc__ else None,
    )
    kernels_sim.add_arguments(ker)
    ker.set_defaults(func=kernels_sim.run_cli)
    mix = sim_sub.add_parser(
        "mixed",
        help="notebooks, training and inference on one pool against the same GPUs split three ways",
        description=mixed_sim.__doc__.splitlines()[0] if mixed_sim.__doc__ else None,
    )
    mixed_sim.add_arguments(mix)
    mix.set_defaults(func=mixed_sim.run_cli)
    wi = sim_sub.add_parser(
        "what-if",
        help="re-run the recorded requests of the last N days with more/fewer GPUs or another "
        "reclaim policy",
        description=whatif.__doc__.splitlines()[0] if whatif.__doc__ else None,
    )
    whatif.add_arguments(wi)
    wi.set_defaults(func=whatif.run_cli)
    return parser


def _needs(module: str, command: str) -> Callable[[argparse.Namespace], int]:
    """A subcommand whose optional dependency is missing: one line naming the extra."""

    def run(args: argparse.Namespace) -> int:
        from .extras import require

        require(module, command)
        return 0

    return run


def _run_app(module: str, cls: str) -> Callable[[argparse.Namespace], int]:
    """A subcommand that hands its own argv to a traitlets application."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        app_class = getattr(importlib.import_module(module), cls)
        app_class.launch_instance(args.rest)
        return 0

    return run


def _upgrade_db(args: argparse.Namespace) -> int:
    import logging

    from .dbutil import migrate

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    before, after = migrate(args.db_url)
    if before == after:
        print(f"pool database at {after}: nothing to migrate")
    else:
        print(f"pool database at {after} (was {before or 'empty'})")
    return 0


def _kernelspecs(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from .kernels.kernelspecs import default_folder, write_kernelspecs
    from .poolclient import PoolClient

    if not args.api_url or not args.token:
        raise ValueError("no pool: pass --api-url and --token (or set $GPUPOOL_API_URL)")
    folder = Path(args.dir) if args.dir else default_folder()  # before asking the pool
    offers = asyncio.run(PoolClient(args.api_url, args.token).offers())
    written = write_kernelspecs(offers, folder)
    print(f"{len(written)} GPU kernelspec(s) written to {folder}: {', '.join(written) or '-'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``jupyterhub-gpupool`` console script."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    apps = {"service", "agent", "reclaimer", "job-runner"}
    if argv and argv[0] in apps:  # traitlets apps parse their own flags
        args = argparse.Namespace(func=parser.parse_args([argv[0]]).func, rest=argv[1:])
    else:
        args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a clear line, never a traceback, for anticipated failures
        from .extras import MissingExtra
        from .pool.errors import PoolError

        if isinstance(e, (PoolError, OSError, ValueError, MissingExtra)):
            print(f"jupyterhub-gpupool: error: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
