"""Replay: benchmark the search engine on recorded, fully measured tuning spaces.

A T4 file (gzip-compressed JSON, see ``shared/tuning-spaces/README.md``) lists every
configuration of a brute-forced space with its outcome; :func:`load_t4` reads it into a
:class:`RecordedSpace`. :func:`replay` runs the engine and random search on it, answering
each proposal from the file, and reports per budget the fraction of the optimum reached
(:class:`ReplayReport`). :func:`write_synthetic` writes generated kernel-like spaces, to
check the engine on spaces it was not designed on.

Modules: ``_t4`` (the file format), ``_runs`` (engine and random runs), ``_scores``
(fractions of the optimum per budget), ``_synthetic`` (generated spaces).
"""

from __future__ import annotations

from spectune.search.replay._prior import prior_configs
from spectune.search.replay._runs import StrategyFactory, engine_run, random_run, replay
from spectune.search.replay._scores import (
    BUDGETS,
    BudgetResult,
    ReplayReport,
    budgets_up_to,
    fraction_curve,
)
from spectune.search.replay._synthetic import SyntheticSpec, make_synthetic, write_synthetic
from spectune.search.replay._t4 import Record, RecordedSpace, T4FileError, load_t4, write_t4

__all__ = [
    "BUDGETS",
    "BudgetResult",
    "Record",
    "RecordedSpace",
    "ReplayReport",
    "StrategyFactory",
    "SyntheticSpec",
    "T4FileError",
    "budgets_up_to",
    "engine_run",
    "fraction_curve",
    "load_t4",
    "make_synthetic",
    "prior_configs",
    "random_run",
    "replay",
    "write_synthetic",
    "write_t4",
]
