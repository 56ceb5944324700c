"""The adapter of the ``sample`` family, the fused sampler: what the tuner and the vLLM
plugin run of it (registered in :data:`spectune.kernels.FAMILIES`, which holds its name,
source hash and space)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels._family import RowsFamily
from spectune.kernels.sampling.gumbel_sample_ref import GumbelReference, gumbel_results_agree
from spectune.kernels.sampling.sample import sample
from spectune.kernels.sampling.sample_inputs import SampleInputs, make_sample_inputs
from spectune.kernels.sampling.sample_ref import sample_reference
from spectune.space import Problem

__all__ = ["SampleFamily"]


class SampleFamily(RowsFamily):
    """Temperature, min-p, top-k/top-p and Gumbel-max in one kernel, as a tunable family."""

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> SampleInputs:
        """``problem.batch`` rows with common sampling settings."""
        return make_sample_inputs(problem, seed=seed, device=device)

    def launch(self, inputs: SampleInputs, config: Mapping[str, int]) -> torch.Tensor:
        """The kernel with ``config``, without the checks that read tensor contents."""
        return sample(*inputs.args(), use_fp64=inputs.use_fp64, config=config,
                               validate=False)

    def reference(self, inputs: SampleInputs) -> GumbelReference:
        """The unfused PyTorch chain's tokens and near-ties."""
        return sample_reference(*inputs.args(), use_fp64=inputs.use_fp64)

    def same(self, expected: GumbelReference | torch.Tensor, actual: torch.Tensor) -> bool:
        """Identical tokens; against a reference, a near-tie apart."""
        if isinstance(expected, GumbelReference):
            return gumbel_results_agree(expected, actual)[0]
        return torch.equal(expected.cpu(), actual.cpu())
