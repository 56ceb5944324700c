"""What the tuner's commands (``sweep``, ``replay``) share on the command line.

Choices read from the registries when first needed, and the one-line error for a missing
``spectune[tune]``. Imports only click: ``spectune --help`` loads every command module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from types import ModuleType

import click

__all__ = ["LazyChoice", "import_tuner", "strategy_names"]


def import_tuner(module: str, *, command: str) -> ModuleType:
    """Import ``module`` for ``spectune COMMAND``; a missing dependency is one line.

    Raises:
        click.ClickException: a third-party module is missing (the ``spectune[tune]``
            extra is not installed); the message names it and the install command.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if not missing or missing == "spectune":
            raise  # our own module missing is a bug, not an install to fix
        raise click.ClickException(
            f"spectune {command} needs the tuner's dependencies ({missing} is missing): "
            "pip install 'spectune[tune]'"
        ) from None


class LazyChoice(click.Choice):
    """A :class:`click.Choice` whose choices are read from a registry when needed.

    The registries (strategies, kernel families) live behind imports of optuna, numpy
    or torch, which listing the commands must not pay for; they are read again at each
    use, so a family registered at run time (tests) is a valid choice.

    Args:
        load: Returns the valid choices.
        metavar: Shown in ``--help`` when the choices cannot be loaded.
    """

    def __init__(self, load: Callable[[], Iterable[str]], *, metavar: str = "NAME") -> None:
        # Not click.Choice.__init__: it would store a fixed tuple of choices.
        self._load = load
        self._metavar = metavar
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        return tuple(self._load())

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        try:
            return super().get_metavar(param, ctx)
        except click.ClickException:  # --help without the tuner installed
            return f"[{self._metavar}]"

    def __repr__(self) -> str:
        return f"LazyChoice({self._load!r})"


def strategy_names(*, command: str) -> list[str]:
    """The ``--sampler`` choices of ``spectune COMMAND``: the strategy registry's names."""
    return sorted(import_tuner("spectune.search", command=command).STRATEGIES)
