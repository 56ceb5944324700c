"""What the MRV2 verification kernels can be tuned over, and what runs untuned.

Imported by the launcher (:mod:`spectune.kernels.rejection_mrv2.rejection_sample_mrv2`),
which validates a given config against :func:`search_space` (:data:`FOLDED`'s when
sampling parameters are folded) and falls back to :func:`default_config`. Not part of
the family's source hash: tuned rows are checked against the declared space by the
database, and the defaults apply only where nothing is tuned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spectune.kernels._space_parts import (
    NUM_STAGES,
    NUM_WARPS,
    SPLITS,
    TILES,
    WAVES_PER_EU,
    FoldedSpace,
    default_splits,
    dtype_name,
    lanes_constraint,
    launch_defaults,
)
from spectune.space import Param, Problem, SearchSpace

if TYPE_CHECKING:
    import torch

__all__ = ["FOLDED", "SEARCH_SPACE", "default_config", "problem_for", "search_space"]

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
# Every statistics tile holds whole softmax groups (GROUP logits, a multiple of which the
# kernels need): tests/kernels/rejection_mrv2 checks it (the constants import Triton, which
# reading a family's space does not).

# Defaults: vLLM's MRV2 tiles (8192 for the statistics, 1024 for resampling).
_DEFAULT_BLOCK_V = 8192
_DEFAULT_BLOCK_R = 1024



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


#: The space of the folded family (``rejection_sample_mrv2_folded``): this one plus the
#: threshold pre-pass's tile and pivots; the same problems and limits (the same kernels).
FOLDED = FoldedSpace(SEARCH_SPACE, default_config=default_config, problem_for=problem_for)
