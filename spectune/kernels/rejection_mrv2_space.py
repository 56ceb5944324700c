"""What the MRV2 verification kernels can be tuned over, and what runs untuned.

Imported by the launcher (:mod:`spectune.kernels.rejection_mrv2`), which validates a
given config against :func:`search_space` and falls back to :func:`default_config`. Not
part of the family's source hash: tuned rows are checked against the declared space by
the database, and the defaults apply only where nothing is tuned.
"""

from __future__ import annotations

import torch

from spectune.kernels._space_parts import LIMITS as _SHARED_LIMITS
from spectune.kernels._space_parts import (
    NUM_STAGES,
    NUM_WARPS,
    SPLITS,
    TILES,
    WAVES_PER_EU,
    default_splits,
    lanes_constraint,
    launch_defaults,
)
from spectune.kernels._tensors import dtype_name
from spectune.kernels.rejection_mrv2_constants import GROUP
from spectune.space import Param, Problem, SearchSpace

__all__ = ["LIMITS", "SEARCH_SPACE", "default_config", "problem_for", "search_space"]

#: Every launch parameter the kernels take, on every backend.
SEARCH_SPACE = SearchSpace(
    params=(
        Param("BLOCK_V", TILES, power_of_two=True,
              doc="vocab tile of the statistics pass (max/argmax, softmax groups)"),
        Param("BLOCK_R", TILES, power_of_two=True,
              doc="vocab tile of the resampling pass (residual + Gumbel-max argmax)"),
        Param("SPLITS", SPLITS, power_of_two=True,
              doc="programs one vocab row is split across (second-stage reduction)"),
        NUM_WARPS,
        NUM_STAGES,
        WAVES_PER_EU,
    ),
    constraints=(lanes_constraint("BLOCK_V", "BLOCK_R"),),
)
if min(TILES) % GROUP.value:
    raise AssertionError("every statistics tile must hold whole softmax groups")

# Defaults: vLLM's MRV2 tiles (8192 for the statistics, 1024 for resampling).
_DEFAULT_BLOCK_V = 8192
_DEFAULT_BLOCK_R = 1024


#: The largest problem the kernels take (see :data:`spectune.kernels._space_parts.LIMITS`).
LIMITS = _SHARED_LIMITS


def search_space(backend: str) -> SearchSpace:
    """The declared launch space on ``backend`` (``waves_per_eu`` only on HIP)."""
    return SEARCH_SPACE.for_backend(backend)


def default_config(problem: Problem, backend: str) -> dict[str, int]:
    """Deterministic config used when nothing is tuned for ``problem``."""
    splits = default_splits(rows=(problem.spec_len + 1) * problem.batch, vocab=problem.vocab,
                            block=_DEFAULT_BLOCK_V, values=SPLITS)
    config = {"BLOCK_V": _DEFAULT_BLOCK_V, "BLOCK_R": _DEFAULT_BLOCK_R, "SPLITS": splits}
    return launch_defaults(config, SEARCH_SPACE, backend)


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
