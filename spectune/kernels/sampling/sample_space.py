"""What the fused sampler can be tuned over, and what runs untuned.

Imported by the launcher (:mod:`spectune.kernels.sampling.sample`). Not part of the family's
source hash.
"""

from __future__ import annotations

from spectune.kernels._space_parts import launch_defaults, rows_problem
from spectune.kernels.sampling.top_k_top_p_space import SEARCH_SPACE as _TOPK_TOPP_SPACE
from spectune.space import Problem, SearchSpace

__all__ = ["SEARCH_SPACE", "default_config", "problem_for", "search_space"]

#: The fused sampler runs the top-k/top-p threshold search plus a Gumbel-max pass: the
#: same parameters, tuned on their own.
SEARCH_SPACE = SearchSpace(params=_TOPK_TOPP_SPACE.params,
                           constraints=_TOPK_TOPP_SPACE.constraints)

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
