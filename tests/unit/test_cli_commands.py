"""Every command module registers its command; a module that fails to import is an error, never
a command silently missing from ``--help``."""

from __future__ import annotations

import argparse

import pytest

from orchestrator.cli import main as cli_main


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_every_command_module_registers_its_command():
    names = {"plan", "devices", "profiles", "status", "run", "profile", "demo"}
    assert names <= _commands(cli_main.build_parser())


def test_a_command_module_that_fails_to_import_is_an_error(monkeypatch):
    broken = (*cli_main.COMMAND_MODULES, "orchestrator.cli.no_such_cmd")
    monkeypatch.setattr(cli_main, "COMMAND_MODULES", broken)
    with pytest.raises(ModuleNotFoundError, match="no_such_cmd"):
        cli_main.build_parser()
