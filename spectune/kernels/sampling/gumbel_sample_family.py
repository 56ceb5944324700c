"""The adapter of the ``gumbel_sample`` family, Gumbel-max sampling (Model Runner V2's
``gumbel_sample``): what the tuner and the vLLM plugin run of it (registered in
:data:`spectune.kernels.FAMILIES`, which holds its name, source hash and space)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels._family import RowsFamily
from spectune.kernels.sampling.gumbel_sample import gumbel_sample
from spectune.kernels.sampling.gumbel_sample_inputs import GumbelInputs, make_gumbel_inputs
from spectune.kernels.sampling.gumbel_sample_ref import (
    GumbelReference,
    gumbel_reference,
    gumbel_results_agree,
)
from spectune.space import Problem

__all__ = ["GumbelSampleFamily"]


class GumbelSampleFamily(RowsFamily):
    """Gumbel-max sampling with vLLM's counter-based noise as a tunable kernel family."""

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> GumbelInputs:
        """``problem.batch`` rows at temperature 1."""
        return make_gumbel_inputs(problem, seed=seed, device=device)

    def launch(self, inputs: GumbelInputs, config: Mapping[str, int]) -> torch.Tensor:
        """The kernels with ``config``, without the checks that read tensor contents."""
        return gumbel_sample(*inputs.args(), config=config, validate=False)

    def reference(self, inputs: GumbelInputs) -> GumbelReference:
        """The PyTorch reference's tokens and near-ties."""
        return gumbel_reference(*inputs.args())

    def same(self, expected: GumbelReference | torch.Tensor, actual: torch.Tensor) -> bool:
        """Identical tokens; against a reference, a near-tie apart."""
        if isinstance(expected, GumbelReference):
            return gumbel_results_agree(expected, actual)[0]
        return torch.equal(expected.cpu(), actual.cpu())
