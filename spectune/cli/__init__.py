"""The ``spectune`` command line."""

from __future__ import annotations

import importlib

import click

from spectune import __version__

__all__ = ["main"]

# Each subcommand lives in its own module and is imported only when present, so the
# CLI starts fast and one broken optional part cannot take the others down.
_COMMANDS = {
    "demo": "spectune.cli.demo:demo",
    "db": "spectune.cli.db:db",
    "sweep": "spectune.cli.sweep:sweep",
    "replay": "spectune.cli.replay:replay",
    "nightly": "spectune.cli.nightly:nightly",
    "doctor": "spectune.cli.doctor:doctor",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in _COMMANDS if self._load(name) is not None)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    @staticmethod
    def _load(name: str) -> click.Command | None:
        target = _COMMANDS.get(name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None
            raise
        return getattr(module, attr)


@click.group(cls=_LazyGroup)
@click.version_option(__version__, prog_name="spectune")
def main() -> None:
    """Tune and run the Triton kernels that verify speculative-decoding drafts."""
