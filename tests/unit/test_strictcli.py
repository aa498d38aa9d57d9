"""The traitlets apps refuse a bad command line (traitlets alone warns and starts anyway)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jupyterhub_gpupool.reclaim.app import ReclaimerApp
from jupyterhub_gpupool.service.app import PoolService
from jupyterhub_gpupool.telemetry.agent import NodeAgent

BAD = [
    (["--PoolService.prot=8080"], "unrecognized option --PoolService.prot"),
    (["--bogus"], "unrecognized option --bogus"),
    (["stray"], "unexpected argument 'stray'"),
    (["--NoSuchClass.port=1"], "unrecognized option --NoSuchClass.port"),
]


@pytest.mark.parametrize("command", ["service", "agent", "reclaimer"])
@pytest.mark.parametrize(("argv", "message"), BAD)
def test_a_bad_command_line_is_one_line_and_exit_2(command, argv, message):
    run = subprocess.run(
        [sys.executable, "-m", "jupyterhub_gpupool.cli", command, *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr == f"jupyterhub-gpupool {command}: error: {message}\n"


def test_a_value_that_is_missing_or_bad_is_named():
    assert PoolService().argv_problem(["--PoolService.port"]) == (
        "option --PoolService.port needs a value"
    )
    with pytest.raises(SystemExit) as e:
        PoolService().parse_command_line(["--PoolService.port=eighty"])
    assert e.value.code == 2


@pytest.mark.parametrize(
    ("app", "argv"),
    [
        (PoolService, ["--PoolService.port=8099", "--MigLabeller.enabled=True", "--debug"]),
        (NodeAgent, ["--Application.log_level=DEBUG"]),
        (ReclaimerApp, ["--ReclaimerApp.interval", "15"]),
    ],
)
def test_good_options_of_the_app_and_its_classes_are_taken(app, argv):
    instance = app()
    instance.parse_command_line(argv)
    assert instance.config  # parsed into the config, nothing refused


def test_a_launchers_subclass_of_the_service_takes_the_services_options():
    """A launcher subclasses the service (tests override ``make_store`` to move its clock):
    ``--PoolService.…`` still names its traits, and a typo is still refused."""

    class Launched(PoolService):
        pass

    app = Launched()
    assert app.argv_problem(["--PoolService.decisions=thread", "--Launched.port=8099"]) is None
    assert app.argv_problem(["--PoolService.prot=80"]) == "unrecognized option --PoolService.prot"
    app.parse_command_line(["--PoolService.decisions=thread"])
    assert app.decisions == "thread"
