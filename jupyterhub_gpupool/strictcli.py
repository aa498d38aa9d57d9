"""Strict command lines for the traitlets apps (service, agent, reclaimer).

traitlets warns about an unknown option and starts anyway, so ``--PoolService.prot=80`` runs a
service on the default port and the typo is one warning in a log nobody reads. Our apps refuse
it instead, as the argparse subcommands do: one line on stderr, exit status 2.

The start every app shares is here too (:meth:`StrictCommandLine.initialize`): the command
line, the log redaction, then the config file; each app's own ``initialize`` only checks and
builds what it needs after that.
"""

from __future__ import annotations

import os
import sys

from traitlets import TraitError
from traitlets.config import Application

from .logredact import install as install_redaction

#: Options every traitlets app understands without declaring them.
BUILTIN_OPTIONS = frozenset({"help", "help-all", "h", "version", "show-config", "show-config-json"})


class StrictCommandLine(Application):
    """An Application whose bad command line is one line on stderr and exit status 2."""

    #: The subcommand's name in messages (``jupyterhub-gpupool <command>: error: ...``).
    command = "app"

    #: the Python config file to load: each app declares it as a trait (``--config``), with
    #: its own default file name (a trait here would show in ``--help-all`` as a class of its own)
    config_file: str

    def initialize(self, argv: list[str] | None = None) -> None:
        """Parse the command line, redact secrets in the logs, load the config file.

        Redaction comes before the file, so a traceback from a config file that fails (which
        traitlets logs and goes on from) has its tokens cut too. A missing file is fine (each
        app's ``config_file`` defaults to one that need not exist); a bad value in it is
        traitlets' ``Bad config`` line and exit status 1.
        """
        super().initialize(argv)
        install_redaction([self.log])
        if self.config_file and os.path.exists(self.config_file):
            self.load_config_file(self.config_file)

    def parse_command_line(self, argv: list[str] | None = None) -> None:
        """Like traitlets', but an unknown option, a missing or bad value, or a stray argument
        is one line on stderr and exit status 2 (traitlets warns and goes on)."""
        argv = list(sys.argv[1:] if argv is None else argv)
        problem = self.argv_problem(argv)
        if problem is None:
            try:  # traitlets' own, without its catch_config_error (which logs and exits 1)
                # __wrapped__: set by the decorator (functools.wraps); not in traitlets' types
                parse = Application.parse_command_line.__wrapped__  # type: ignore[attr-defined]  # see above
                parse(self, argv)
                return
            except (TraitError, ValueError) as e:
                problem = str(e).splitlines()[0]
        print(f"jupyterhub-gpupool {self.command}: error: {problem}", file=sys.stderr)
        self.exit(2)

    def argv_problem(self, argv: list[str]) -> str | None:
        """What is wrong with ``argv`` (``None``: nothing): every ``--Class.trait`` must name a
        configurable trait of this app, an app it subclasses (a launcher's subclass of the
        service still takes ``--PoolService.…``), ``Application`` or a class in ``classes``."""
        known = set(self.aliases) | set(self.flags) | BUILTIN_OPTIONS
        apps = [c for c in type(self).__mro__ if issubclass(c, Application)]
        classes = {c.__name__: c for c in (*apps, *self.classes)}
        i = 0
        while i < len(argv):
            arg = argv[i]
            i += 1
            if not arg.startswith("-") or arg in ("-", "--"):
                return f"unexpected argument {arg!r}"
            name, eq, _ = arg.lstrip("-").partition("=")
            if "." in name:
                cls, _, trait = name.partition(".")
                if cls not in classes or trait not in classes[cls].class_traits(config=True):
                    return f"unrecognized option --{name}"
            elif name not in known:
                return f"unrecognized option --{name}"
            takes_value = "." in name or name in self.aliases
            if takes_value and not eq:
                if i >= len(argv) or argv[i].startswith("--"):
                    return f"option --{name} needs a value"
                i += 1
        return None
