"""What the temperature kernel can be tuned over, and what runs untuned.

Imported by the launcher (:mod:`spectune.kernels.sampling.temperature`). Not part of the
family's source hash.
"""

from __future__ import annotations

from spectune.kernels._space_parts import (
    NUM_STAGES,
    NUM_WARPS,
    TILES,
    WAVES_PER_EU,
    lanes_constraint,
    launch_defaults,
    rows_problem,
)
from spectune.space import Param, Problem, SearchSpace

__all__ = ["SEARCH_SPACE", "default_config", "problem_for", "search_space"]

#: Every launch parameter the kernel takes, on every backend. One program scales one
#: ``BLOCK_V``-wide tile of one row (no loop: ``num_stages`` is kept for the launch's
#: sake, as every family declares it).
SEARCH_SPACE = SearchSpace(
    params=(
        Param("BLOCK_V", TILES, power_of_two=True,
              doc="vocab tile one program scales (grid: rows x tiles)"),
        NUM_WARPS,
        NUM_STAGES,
        WAVES_PER_EU,
    ),
    constraints=(lanes_constraint("BLOCK_V"),),
)

# Default: vLLM's MRV2 temperature tile.
_DEFAULT_BLOCK_V = 8192



def search_space(backend: str) -> SearchSpace:
    """The declared launch space on ``backend`` (``waves_per_eu`` only on HIP)."""
    return SEARCH_SPACE.for_backend(backend)


def default_config(problem: Problem, backend: str) -> dict[str, int]:
    """Deterministic config used when nothing is tuned for ``problem`` (vLLM's tile)."""
    del problem
    return launch_defaults({"BLOCK_V": _DEFAULT_BLOCK_V}, SEARCH_SPACE, backend)


#: The problem of one launch's shape (rows as the batch, vocabulary, dtype).
problem_for = rows_problem
