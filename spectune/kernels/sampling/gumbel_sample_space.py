"""What the Gumbel-max sampling kernels can be tuned over, and what runs untuned.

Imported by the launcher (:mod:`spectune.kernels.sampling.gumbel_sample`). Not part of the
family's source hash.
"""

from __future__ import annotations

from spectune.kernels._space_parts import rows_problem, split_rows_default, split_rows_space
from spectune.space import Problem, SearchSpace

__all__ = ["SEARCH_SPACE", "default_config", "problem_for", "search_space"]

#: Every launch parameter the kernels take, on every backend. vLLM launches one program
#: per 1024-logit tile, so rows may be split further than the verification families'.
SEARCH_SPACE = split_rows_space(
    splits_doc="programs one vocab row is split across (second-stage reduction)")

# Default: vLLM's MRV2 sampling tile.
_DEFAULT_BLOCK_V = 1024



def search_space(backend: str) -> SearchSpace:
    """The declared launch space on ``backend`` (``waves_per_eu`` only on HIP)."""
    return SEARCH_SPACE.for_backend(backend)


def default_config(problem: Problem, backend: str) -> dict[str, int]:
    """Deterministic config used when nothing is tuned for ``problem``."""
    return split_rows_default(problem, backend, SEARCH_SPACE, block=_DEFAULT_BLOCK_V)


#: The problem of one launch's shape (rows as the batch, vocabulary, dtype).
problem_for = rows_problem
