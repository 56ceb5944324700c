"""Tuning: the search engine (studies, trials, stop conditions) and replays of recorded spaces.

The engine (:class:`Search`, :func:`search`) proposes one configuration of a
:class:`~spectune.space.SearchSpace` at a time through an Optuna study, evaluates it with
an objective that returns an :class:`Outcome`, and records it. A :class:`Strategy` (one
of :data:`STRATEGIES`: ``auto``, and the baselines ``tpe``, ``optuna-gp`` and ``random``;
or your own, written against :class:`Strategy`, :class:`ProposalContext` and
:class:`History`) picks each configuration. The subpackage
:mod:`spectune.autotune.replay` benchmarks the same engine on fully measured spaces (T4
files); :mod:`spectune.autotune.sweep` tunes the kernel families on this device.
"""

from __future__ import annotations

from spectune.autotune._engine import (
    STOP_REASONS,
    Objective,
    Search,
    SearchObserver,
    SearchProgress,
    SearchResult,
    search,
)
from spectune.autotune._isolated import IsolatedRunner
from spectune.autotune._outcome import FAILURE_KINDS, Outcome, Status, TrialRecord
from spectune.autotune._space_index import SpaceIndex
from spectune.autotune._strategies import STRATEGIES
from spectune.autotune._strategy import History, ProposalContext, Strategy
from spectune.autotune._transfer import TransferStrategy

__all__ = [
    "FAILURE_KINDS",
    "STOP_REASONS",
    "STRATEGIES",
    "History",
    "IsolatedRunner",
    "Objective",
    "Outcome",
    "ProposalContext",
    "Search",
    "SearchObserver",
    "SearchProgress",
    "SearchResult",
    "SpaceIndex",
    "Status",
    "Strategy",
    "TransferStrategy",
    "TrialRecord",
    "search",
]
