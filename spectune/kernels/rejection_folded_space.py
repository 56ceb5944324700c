"""What the V1 verification kernels with sampling parameters folded in can be tuned over.

The family's own space (:mod:`spectune.kernels.rejection_space`) plus the tile and pivots
of the pre-pass that finds each row's thresholds (:mod:`spectune.kernels._folding`).
Not part of any source hash.
"""

from __future__ import annotations

from spectune.kernels import rejection_space
from spectune.kernels._space_parts import FOLD_DEFAULTS, folded_space
from spectune.space import Problem, SearchSpace

__all__ = ["LIMITS", "SEARCH_SPACE", "default_config", "problem_for", "search_space"]

#: Every launch parameter the folded kernels take, on every backend.
SEARCH_SPACE = folded_space(rejection_space.SEARCH_SPACE)

#: The same shapes as the unfolded family's.
problem_for = rejection_space.problem_for
#: The same limits as the unfolded family's (the same kernels).
LIMITS = rejection_space.LIMITS


def search_space(backend: str) -> SearchSpace:
    """The declared launch space on ``backend`` (``waves_per_eu`` only on HIP)."""
    return SEARCH_SPACE.for_backend(backend)


def default_config(problem: Problem, backend: str) -> dict[str, int]:
    """The unfolded family's default for ``problem``, and the pre-pass's defaults."""
    config = {**rejection_space.default_config(problem, backend), **FOLD_DEFAULTS}
    return search_space(backend).validate(config)
