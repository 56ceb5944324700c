"""What the top-k/top-p masking kernel can be tuned over, and what runs untuned.

Imported by the launcher (:mod:`spectune.kernels.sampling.top_k_top_p`). Not part of the family's
source hash.
"""

from __future__ import annotations

from spectune.kernels._space_parts import (
    NUM_STAGES,
    NUM_WARPS,
    PIVOTS,
    TILES,
    WAVES_PER_EU,
    lanes_constraint,
    launch_defaults,
    pivots_constraint,
    rows_problem,
)
from spectune.space import Param, Problem, SearchSpace

__all__ = ["SEARCH_SPACE", "default_config", "problem_for", "search_space"]

#: Every launch parameter the kernel takes, on every backend.
SEARCH_SPACE = SearchSpace(
    params=(
        Param("BLOCK_V", TILES, power_of_two=True, doc="vocab tile one program loads per step"),
        PIVOTS,
        NUM_WARPS,
        NUM_STAGES,
        WAVES_PER_EU,
    ),
    constraints=(lanes_constraint("BLOCK_V"), pivots_constraint("BLOCK_V")),
)

_DEFAULT = {"BLOCK_V": 2048, "PIVOTS": 16}



def search_space(backend: str) -> SearchSpace:
    """The declared launch space on ``backend`` (``waves_per_eu`` only on HIP)."""
    return SEARCH_SPACE.for_backend(backend)


def default_config(problem: Problem, backend: str) -> dict[str, int]:
    """Deterministic config used when nothing is tuned for ``problem``."""
    del problem
    return launch_defaults(dict(_DEFAULT), SEARCH_SPACE, backend)


#: The problem of one launch's shape (rows as the batch, vocabulary, dtype).
problem_for = rows_problem
