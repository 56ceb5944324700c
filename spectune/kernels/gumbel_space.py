"""What the Gumbel-max sampling kernels can be tuned over, and what runs untuned.

Imported by the launcher (:mod:`spectune.kernels.gumbel`). Not part of the
family's source hash.
"""

from __future__ import annotations

from spectune.kernels._space_parts import (
    NUM_STAGES,
    NUM_WARPS,
    SPLITS,
    TILES,
    WAVES_PER_EU,
    default_splits,
    lanes_constraint,
    launch_defaults,
    rows_problem,
)
from spectune.space import Param, Problem, SearchSpace

__all__ = ["SEARCH_SPACE", "default_config", "problem_for", "search_space"]

#: Every launch parameter the kernels take, on every backend. vLLM launches one program
#: per 1024-logit tile, so rows may be split further than the verification families'.
SEARCH_SPACE = SearchSpace(
    params=(
        Param("BLOCK_V", TILES, power_of_two=True, doc="vocab tile one program loads per step"),
        Param("SPLITS", (*SPLITS, 128, 256), power_of_two=True,
              doc="programs one vocab row is split across (second-stage reduction)"),
        NUM_WARPS,
        NUM_STAGES,
        WAVES_PER_EU,
    ),
    constraints=(lanes_constraint("BLOCK_V"),),
)

# Default: vLLM's MRV2 sampling tile.
_DEFAULT_BLOCK_V = 1024


def search_space(backend: str) -> SearchSpace:
    """The declared launch space on ``backend`` (``waves_per_eu`` only on HIP)."""
    return SEARCH_SPACE.for_backend(backend)


def default_config(problem: Problem, backend: str) -> dict[str, int]:
    """Deterministic config used when nothing is tuned for ``problem``."""
    splits = default_splits(rows=problem.batch, vocab=problem.vocab, block=_DEFAULT_BLOCK_V,
                            values=SEARCH_SPACE.param("SPLITS").values)
    return launch_defaults({"BLOCK_V": _DEFAULT_BLOCK_V, "SPLITS": splits}, SEARCH_SPACE,
                           backend)


#: The problem of one launch's shape (rows as the batch, vocabulary, dtype).
problem_for = rows_problem
