"""The search engine: studies, strategies, study storage, and replays of recorded spaces.

The engine (:class:`Search`, :func:`search`) proposes one configuration of a
:class:`~spectune.space.SearchSpace` at a time through an Optuna study, evaluates it with
an objective that returns an :class:`Outcome`, and records it. A :class:`Strategy` (one
of :data:`STRATEGIES`: ``auto``, and the baselines ``tpe``, ``optuna-gp`` and ``random``;
or your own, written against :class:`Strategy`, :class:`ProposalContext` and
:class:`History`) picks each configuration. The subpackage
:mod:`spectune.search.replay` benchmarks the same engine on fully measured spaces (T4
files); :mod:`spectune.tuning.sweep` tunes the kernel families on this device.
"""

from __future__ import annotations

from spectune.search._engine import (
    STOP_REASONS,
    Objective,
    Search,
    SearchObserver,
    SearchProgress,
    SearchResult,
    search,
    succeeded,
    time_order,
)
from spectune.search._outcome import FAILURE_KINDS, Outcome, Status, TrialRecord
from spectune.search._space_index import SpaceIndex
from spectune.search._storage import StorageUnavailableError, display_storage, studies_beside
from spectune.search._strategies import STRATEGIES, make_strategy
from spectune.search._strategy import History, ProposalContext, Strategy
from spectune.search._transfer import TransferStrategy

__all__ = [
    "FAILURE_KINDS",
    "STOP_REASONS",
    "STRATEGIES",
    "History",
    "Objective",
    "Outcome",
    "ProposalContext",
    "Search",
    "SearchObserver",
    "SearchProgress",
    "SearchResult",
    "SpaceIndex",
    "Status",
    "StorageUnavailableError",
    "Strategy",
    "TransferStrategy",
    "TrialRecord",
    "display_storage",
    "make_strategy",
    "search",
    "studies_beside",
    "succeeded",
    "time_order",
]
