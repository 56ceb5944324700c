"""What the MRV2 verification kernels can be tuned over, and what runs untuned.

Imported by the launcher (:mod:`spectune.kernels.rejection_mrv2`), which validates a
given config against :func:`search_space` and falls back to :func:`default_config`. Not
part of the family's source hash: tuned rows are checked against the declared space by
the database, and the defaults apply only where nothing is tuned.
"""

from __future__ import annotations

import torch
import triton

from spectune.kernels._tensors import dtype_name
from spectune.kernels.rejection_mrv2_constants import GROUP
from spectune.space import Constraint, Param, Problem, SearchSpace

__all__ = ["SEARCH_SPACE", "default_config", "problem_for", "search_space"]

_TILES = (256, 512, 1024, 2048, 4096, 8192, 16384)

#: Every launch parameter the kernels take, on every backend.
SEARCH_SPACE = SearchSpace(
    params=(
        Param("BLOCK_V", _TILES, power_of_two=True,
              doc="vocab tile of the statistics pass (max/argmax, softmax groups)"),
        Param("BLOCK_R", _TILES, power_of_two=True,
              doc="vocab tile of the resampling pass (residual + Gumbel-max argmax)"),
        Param("SPLITS", (1, 2, 4, 8, 16, 32, 64), power_of_two=True,
              doc="programs one vocab row is split across (second-stage reduction)"),
        Param("num_warps", (1, 2, 4, 8, 16), power_of_two=True, doc="warps per program"),
        Param("num_stages", (1, 2, 3, 4), doc="software-pipelining depth of the tile loops"),
        Param("waves_per_eu", (0, 1, 2, 3, 4), backends=("hip",),
              doc="AMD occupancy hint: waves per execution unit (0 = compiler's choice)"),
    ),
    constraints=(
        Constraint(
            "BLOCK_V >= 64 * num_warps and BLOCK_R >= 64 * num_warps: every lane of a "
            "64-wide wavefront holds an element",
            lambda c: min(c["BLOCK_V"], c["BLOCK_R"]) >= 64 * c["num_warps"],
        ),
    ),
)
if min(_TILES) % GROUP.value:
    raise AssertionError("every statistics tile must hold whole softmax groups")

# Defaults: vLLM's MRV2 tiles (8192 for the statistics, 1024 for resampling) and Triton's
# default 4 warps, with enough splits that about this many programs stream the vocabulary
# (a few per compute unit on a 100-300 CU GPU).
_DEFAULT_BLOCK_V = 8192
_DEFAULT_BLOCK_R = 1024
_DEFAULT_NUM_WARPS = 4
_DEFAULT_NUM_STAGES = 2
_DEFAULT_TARGET_PROGRAMS = 512
_DEFAULT_WAVES_PER_EU = 0


def search_space(backend: str) -> SearchSpace:
    """The declared launch space on ``backend`` (``waves_per_eu`` only on HIP)."""
    return SEARCH_SPACE.for_backend(backend)


def default_config(problem: Problem, backend: str) -> dict[str, int]:
    """Deterministic config used when nothing is tuned for ``problem``."""
    rows = (problem.spec_len + 1) * problem.batch
    tiles = triton.cdiv(problem.vocab, _DEFAULT_BLOCK_V)
    want = max(1, triton.cdiv(_DEFAULT_TARGET_PROGRAMS, rows))
    splits_values = SEARCH_SPACE.param("SPLITS").values
    splits = max(s for s in splits_values if s <= min(want, tiles) or s == splits_values[0])
    config = {
        "BLOCK_V": _DEFAULT_BLOCK_V,
        "BLOCK_R": _DEFAULT_BLOCK_R,
        "SPLITS": splits,
        "num_warps": _DEFAULT_NUM_WARPS,
        "num_stages": _DEFAULT_NUM_STAGES,
    }
    if backend == "hip":
        config["waves_per_eu"] = _DEFAULT_WAVES_PER_EU
    return search_space(backend).validate(config)


def problem_for(
    *, num_speculative_steps: int, num_reqs: int, vocab: int, dtype: torch.dtype,
    draft_logits: bool,
) -> Problem:
    """The tuning problem of one launch's shape (what its config is looked up for).

    A launch with ``k = 0`` or without requests counts as one draft or one request: a
    :class:`~spectune.space.Problem` is at least 1 in each.

    Args:
        num_speculative_steps: The launch's ``k``.
        num_reqs: Requests (``len(cu_num_logits) - 1``).
        vocab: Vocabulary size (``target_logits.shape[1]``).
        dtype: Dtype of ``target_logits``.
        draft_logits: Whether ``draft_logits`` is given (``Problem.draft_probs``).
    """
    return Problem(
        spec_len=max(num_speculative_steps, 1), batch=max(num_reqs, 1), vocab=vocab,
        dtype=dtype_name(dtype), draft_probs=draft_logits,
    )
