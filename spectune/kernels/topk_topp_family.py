"""Top-k/top-p masking as a :class:`~spectune.kernels.KernelFamily`."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels import _truncation, rejection_constants, topk_topp
from spectune.kernels._code_hash import code_hash
from spectune.kernels.topk_topp_inputs import TopKTopPInputs, make_top_k_top_p_inputs
from spectune.kernels.topk_topp_reference import (
    TopKTopPReference,
    top_k_top_p_reference,
    top_k_top_p_results_agree,
)
from spectune.kernels.topk_topp_space import default_config, problem_for, search_space
from spectune.space import Problem, SearchSpace

__all__ = ["FAMILY", "TopKTopPFamily"]


class TopKTopPFamily:
    """Exact top-k/top-p masking as a tunable kernel family.

    Attributes:
        name: ``top_k_top_p``.
        source_modules: The kernel and launcher (:mod:`spectune.kernels.topk_topp`), the
            threshold search (:mod:`spectune.kernels._truncation`) and its fixed-point
            constant (:mod:`spectune.kernels.rejection_constants`).
        source_hash: Hash of their code.
    """

    name = "top_k_top_p"
    source_modules = (topk_topp, _truncation, rejection_constants)

    def __init__(self) -> None:
        self.source_hash = code_hash(*self.source_modules)

    def search_space(self, backend: str) -> SearchSpace:
        """The declared launch space on ``backend``."""
        return search_space(backend)

    def default_config(self, problem: Problem, backend: str) -> dict[str, int]:
        """The launcher's config when nothing is tuned for ``problem``."""
        return default_config(problem, backend)

    def problem_of(self, inputs: TopKTopPInputs) -> Problem:
        """The problem ``inputs`` belong to (rows as the batch, vocabulary, dtype)."""
        num_tokens, vocab = inputs.logits.shape
        return problem_for(num_tokens=num_tokens, vocab=vocab, dtype=inputs.logits.dtype)

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> TopKTopPInputs:
        """``problem.batch`` rows with common (top_k, top_p) settings."""
        return make_top_k_top_p_inputs(problem, seed=seed, device=device)

    def launch(self, inputs: TopKTopPInputs, config: Mapping[str, int]) -> torch.Tensor:
        """The kernel with ``config`` on a copy of the logits (it masks in place; the copy
        costs every config the same), without the checks that read tensor contents."""
        return topk_topp.top_k_top_p(*inputs.args(), config=config, validate=False)

    def reference(self, inputs: TopKTopPInputs) -> TopKTopPReference:
        """The PyTorch reference's masked logits and ambiguous tokens."""
        return top_k_top_p_reference(inputs.logits, inputs.k, inputs.p)

    def same(self, expected: TopKTopPReference | torch.Tensor, actual: torch.Tensor) -> bool:
        """Identical masked logits; against a reference, its ambiguous tokens apart."""
        if isinstance(expected, TopKTopPReference):
            return top_k_top_p_results_agree(expected, actual)[0]
        return torch.equal(expected.cpu(), actual.cpu())


#: The registered instance (see :data:`spectune.kernels.FAMILIES`).
FAMILY = TopKTopPFamily()
