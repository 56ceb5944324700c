"""Gumbel-max sampling (MRV2's ``gumbel_sample``) as a :class:`~spectune.kernels.KernelFamily`."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels import _counter_rng, _launch, _reductions, gumbel, gumbel_space
from spectune.kernels._family import RowsFamily
from spectune.kernels.gumbel_inputs import GumbelInputs, make_gumbel_inputs
from spectune.kernels.gumbel_reference import (
    GumbelReference,
    gumbel_reference,
    gumbel_results_agree,
)
from spectune.space import Problem

__all__ = ["FAMILY", "GumbelSampleFamily"]


class GumbelSampleFamily(RowsFamily):
    """Gumbel-max sampling with vLLM's counter-based noise as a tunable kernel family.

    Attributes:
        name: ``gumbel_sample``.
        source_modules: The kernels and launcher (:mod:`spectune.kernels.gumbel`),
            vLLM's random streams (:mod:`spectune.kernels._counter_rng`) and the shared
            reductions (:mod:`spectune.kernels._reductions`).
        source_hash: Hash of their code.
    """

    name = "gumbel_sample"
    source_modules = (gumbel, _counter_rng, _reductions, _launch)
    space = gumbel_space

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> GumbelInputs:
        """``problem.batch`` rows at temperature 1."""
        return make_gumbel_inputs(problem, seed=seed, device=device)

    def launch(self, inputs: GumbelInputs, config: Mapping[str, int]) -> torch.Tensor:
        """The kernels with ``config``, without the checks that read tensor contents."""
        return gumbel.gumbel_sample(*inputs.args(), config=config, validate=False)

    def reference(self, inputs: GumbelInputs) -> GumbelReference:
        """The PyTorch reference's tokens and near-ties."""
        return gumbel_reference(*inputs.args())

    def same(self, expected: GumbelReference | torch.Tensor, actual: torch.Tensor) -> bool:
        """Identical tokens; against a reference, a near-tie apart."""
        if isinstance(expected, GumbelReference):
            return gumbel_results_agree(expected, actual)[0]
        return torch.equal(expected.cpu(), actual.cpu())


#: The registered instance (see :data:`spectune.kernels.FAMILIES`).
FAMILY = GumbelSampleFamily()
