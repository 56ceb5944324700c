"""The adapter of the ``top_k_top_p`` family, top-k/top-p masking: what the tuner and the
vLLM plugin run of it (registered in :data:`spectune.kernels.FAMILIES`, which holds its
name, source hash and space)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels._family import RowsFamily
from spectune.kernels.sampling.top_k_top_p import top_k_top_p
from spectune.kernels.sampling.top_k_top_p_inputs import TopKTopPInputs, make_top_k_top_p_inputs
from spectune.kernels.sampling.top_k_top_p_ref import (
    TopKTopPReference,
    top_k_top_p_reference,
    top_k_top_p_results_agree,
)
from spectune.space import Problem

__all__ = ["TopKTopPFamily"]


class TopKTopPFamily(RowsFamily):
    """Exact top-k/top-p masking as a tunable kernel family."""

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> TopKTopPInputs:
        """``problem.batch`` rows with common (top_k, top_p) settings."""
        return make_top_k_top_p_inputs(problem, seed=seed, device=device)

    def launch(self, inputs: TopKTopPInputs, config: Mapping[str, int]) -> torch.Tensor:
        """The kernel with ``config`` on a copy of the logits (it masks in place; the copy
        costs every config the same), without the checks that read tensor contents."""
        return top_k_top_p(*inputs.args(), config=config, validate=False)

    def reference(self, inputs: TopKTopPInputs) -> TopKTopPReference:
        """The PyTorch reference's masked logits and ambiguous tokens."""
        return top_k_top_p_reference(inputs.logits, inputs.k, inputs.p)

    def same(self, expected: TopKTopPReference | torch.Tensor, actual: torch.Tensor) -> bool:
        """Identical masked logits; against a reference, its ambiguous tokens apart."""
        if isinstance(expected, TopKTopPReference):
            return top_k_top_p_results_agree(expected, actual)[0]
        return torch.equal(expected.cpu(), actual.cpu())
