"""The ``spectune`` command line."""

from __future__ import annotations

import importlib

import click

from spectune import __version__

__all__ = ["COMMANDS", "main"]

# Each command lives in its own module, imported when the command is used (or listed),
# so the CLI starts fast; a command module imports its heavy dependencies (torch, optuna)
# inside the command. Every entry here has its module: a test loads them all.
COMMANDS = {
    "db": "spectune.cli.db:db",
    "demo": "spectune.cli.demo:demo",
    "doctor": "spectune.cli.doctor:doctor",
    "nightly": "spectune.cli.nightly:nightly",
    "replay": "spectune.cli.replay:replay",
    "sweep": "spectune.cli.sweep:sweep",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None  # click reports "No such command" (a usage error, exit 2)
        module_name, attr = target.split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attr)
        return command


@click.group(cls=_LazyGroup)
@click.version_option(__version__, prog_name="spectune")
def main() -> None:
    """Tune and run the Triton kernels that verify speculative-decoding drafts."""
