"""The fused sampler as a :class:`~spectune.kernels.KernelFamily`."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels import (
    _counter_rng,
    _launch,
    _reductions,
    _truncation,
    rejection_constants,
    sampling,
    sampling_space,
)
from spectune.kernels._family import RowsFamily
from spectune.kernels.gumbel_reference import GumbelReference, gumbel_results_agree
from spectune.kernels.sampling_inputs import SampleInputs, make_sample_inputs
from spectune.kernels.sampling_reference import sample_reference
from spectune.space import Problem

__all__ = ["FAMILY", "SampleFamily"]


class SampleFamily(RowsFamily):
    """Temperature, min-p, top-k/top-p and Gumbel-max in one kernel, as a tunable family.

    Attributes:
        name: ``sample``.
        source_modules: The kernel and launcher (:mod:`spectune.kernels.sampling`), the
            threshold search (:mod:`spectune.kernels._truncation`), vLLM's random streams
            (:mod:`spectune.kernels._counter_rng`), the shared reductions and the
            fixed-point constant.
        source_hash: Hash of their code.
    """

    name = "sample"
    source_modules = (sampling, _truncation, _counter_rng, _reductions, rejection_constants,
                      _launch)
    space = sampling_space

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> SampleInputs:
        """``problem.batch`` rows with common sampling settings."""
        return make_sample_inputs(problem, seed=seed, device=device)

    def launch(self, inputs: SampleInputs, config: Mapping[str, int]) -> torch.Tensor:
        """The kernel with ``config``, without the checks that read tensor contents."""
        return sampling.sample(*inputs.args(), use_fp64=inputs.use_fp64, config=config,
                               validate=False)

    def reference(self, inputs: SampleInputs) -> GumbelReference:
        """The unfused PyTorch chain's tokens and near-ties."""
        return sample_reference(*inputs.args(), use_fp64=inputs.use_fp64)

    def same(self, expected: GumbelReference | torch.Tensor, actual: torch.Tensor) -> bool:
        """Identical tokens; against a reference, a near-tie apart."""
        if isinstance(expected, GumbelReference):
            return gumbel_results_agree(expected, actual)[0]
        return torch.equal(expected.cpu(), actual.cpu())


#: The registered instance (see :data:`spectune.kernels.FAMILIES`).
FAMILY = SampleFamily()
