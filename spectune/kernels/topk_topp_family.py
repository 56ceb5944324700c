"""Top-k/top-p masking as a :class:`~spectune.kernels.KernelFamily`."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels import _launch, _truncation, rejection_constants, topk_topp, topk_topp_space
from spectune.kernels._family import RowsFamily
from spectune.kernels.topk_topp_inputs import TopKTopPInputs, make_top_k_top_p_inputs
from spectune.kernels.topk_topp_reference import (
    TopKTopPReference,
    top_k_top_p_reference,
    top_k_top_p_results_agree,
)
from spectune.space import Problem

__all__ = ["FAMILY", "TopKTopPFamily"]


class TopKTopPFamily(RowsFamily):
    """Exact top-k/top-p masking as a tunable kernel family.

    Attributes:
        name: ``top_k_top_p``.
        source_modules: The kernel and launcher (:mod:`spectune.kernels.topk_topp`), the
            threshold search (:mod:`spectune.kernels._truncation`) and its fixed-point
            constant (:mod:`spectune.kernels.rejection_constants`).
        source_hash: Hash of their code.
    """

    name = "top_k_top_p"
    source_modules = (topk_topp, _truncation, rejection_constants, _launch)
    space = topk_topp_space

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
