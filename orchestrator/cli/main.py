"""Entry point of the ``orchestrator`` command.

Sub-commands are registered from small modules (``register(subparsers)`` each). User mistakes
(:class:`~orchestrator.errors.UserError`) print one line and exit with code 2; nothing else is
caught here, so a bug still shows its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from orchestrator import __version__
from orchestrator.errors import UserError

# Modules that define sub-commands, in the order `--help` lists them. Imported lazily-light:
# each module imports its heavy dependencies inside the command function.
COMMAND_MODULES = (
    "orchestrator.cli.plan_cmd",
    "orchestrator.cli.devices_cmd",
    "orchestrator.cli.profiles_cmd",
    "orchestrator.cli.status_cmd",
    "orchestrator.cli.run_cmd",
    "orchestrator.cli.profile_cmd",
    "orchestrator.cli.demo_cmd",
    "orchestrator.cli.data_cmd",
    "orchestrator.cli.export_cmd",
)

EXIT_USER_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line (with where to look) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="orchestrator",
        description="Plan, run and adapt PyTorch training on mixed and changing GPU clusters.",
    )
    parser.add_argument("--version", action="version", version=f"orchestrator {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        # Every command module must import: a broken one fails the command loudly rather than
        # vanishing from `--help`.
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except UserError as exc:
        print(f"orchestrator {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"orchestrator {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
