"""What the fused sampler can be tuned over, and what runs untuned.

Imported by the launcher (:mod:`spectune.kernels.sampling`). Not part of the family's
source hash.
"""

from __future__ import annotations

import torch

from spectune.kernels._space_parts import launch_defaults
from spectune.kernels._tensors import dtype_name
from spectune.kernels.topk_topp_space import SEARCH_SPACE as _TOPK_TOPP_SPACE
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


def problem_for(*, num_tokens: int, vocab: int, dtype: torch.dtype) -> Problem:
    """The tuning problem of one launch's shape: rows (as ``batch``), vocabulary, dtype."""
    return Problem(spec_len=1, batch=max(num_tokens, 1), vocab=vocab,
                   dtype=dtype_name(dtype), draft_probs=False)
