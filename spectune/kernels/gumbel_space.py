"""What the Gumbel-max sampling kernels can be tuned over, and what runs untuned.

Imported by the launcher (:mod:`spectune.kernels.gumbel`). Not part of the
family's source hash.
"""

from __future__ import annotations

import torch
import triton

from spectune.kernels._tensors import dtype_name
from spectune.space import Constraint, Param, Problem, SearchSpace

__all__ = ["SEARCH_SPACE", "default_config", "problem_for", "search_space"]

#: Every launch parameter the kernels take, on every backend.
SEARCH_SPACE = SearchSpace(
    params=(
        Param("BLOCK_V", (256, 512, 1024, 2048, 4096, 8192, 16384), power_of_two=True,
              doc="vocab tile one program loads per step"),
        Param("SPLITS", (1, 2, 4, 8, 16, 32, 64, 128, 256), power_of_two=True,
              doc="programs one vocab row is split across (second-stage reduction)"),
        Param("num_warps", (1, 2, 4, 8, 16), power_of_two=True, doc="warps per program"),
        Param("num_stages", (1, 2, 3, 4), doc="software-pipelining depth of the tile loop"),
        Param("waves_per_eu", (0, 1, 2, 3, 4), backends=("hip",),
              doc="AMD occupancy hint: waves per execution unit (0 = compiler's choice)"),
    ),
    constraints=(
        Constraint(
            "BLOCK_V >= 64 * num_warps: every lane of a 64-wide wavefront holds an element",
            lambda c: c["BLOCK_V"] >= 64 * c["num_warps"],
        ),
    ),
)

# Defaults: vLLM's MRV2 tile (1024) and Triton's default 4 warps, with enough splits that
# about this many programs stream the vocabulary (vLLM launches one program per tile).
_DEFAULT_BLOCK_V = 1024
_DEFAULT_NUM_WARPS = 4
_DEFAULT_NUM_STAGES = 2
_DEFAULT_TARGET_PROGRAMS = 512
_DEFAULT_WAVES_PER_EU = 0


def search_space(backend: str) -> SearchSpace:
    """The declared launch space on ``backend`` (``waves_per_eu`` only on HIP)."""
    return SEARCH_SPACE.for_backend(backend)


def default_config(problem: Problem, backend: str) -> dict[str, int]:
    """Deterministic config used when nothing is tuned for ``problem``."""
    tiles = triton.cdiv(problem.vocab, _DEFAULT_BLOCK_V)
    want = max(1, triton.cdiv(_DEFAULT_TARGET_PROGRAMS, problem.batch))
    splits_values = SEARCH_SPACE.param("SPLITS").values
    splits = max(s for s in splits_values if s <= min(want, tiles) or s == splits_values[0])
    config = {
        "BLOCK_V": _DEFAULT_BLOCK_V,
        "SPLITS": splits,
        "num_warps": _DEFAULT_NUM_WARPS,
        "num_stages": _DEFAULT_NUM_STAGES,
    }
    if backend == "hip":
        config["waves_per_eu"] = _DEFAULT_WAVES_PER_EU
    return search_space(backend).validate(config)


def problem_for(*, num_tokens: int, vocab: int, dtype: torch.dtype) -> Problem:
    """The tuning problem of one launch's shape: rows (as ``batch``), vocabulary, dtype.

    Sampling has no speculation length: ``spec_len`` is 1 and ``draft_probs`` False.
    """
    return Problem(spec_len=1, batch=max(num_tokens, 1), vocab=vocab,
                   dtype=dtype_name(dtype), draft_probs=False)
