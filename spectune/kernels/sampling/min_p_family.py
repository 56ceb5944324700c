"""The adapter of the ``min_p`` family, min-p filtering (Model Runner V2's ``apply_min_p``):
what the tuner and the vLLM plugin run of it (registered in
:data:`spectune.kernels.FAMILIES`, which holds its name, source hash and space)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels._family import RowsFamily
from spectune.kernels.sampling.min_p import apply_min_p
from spectune.kernels.sampling.min_p_inputs import MinPInputs, make_min_p_inputs
from spectune.kernels.sampling.min_p_ref import (
    MinPReference,
    min_p_reference,
    min_p_results_agree,
)
from spectune.space import Problem

__all__ = ["MinPFamily"]


class MinPFamily(RowsFamily):
    """Min-p filtering of logits rows, in place, as a tunable kernel family.

    The kernels work in place; :meth:`launch` writes into the inputs' ``out`` buffer
    instead (same kernels, same memory traffic), so the shared logits never change and
    the tuner's repeated launches all give the reference's result."""

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> MinPInputs:
        """``problem.batch`` rows at a mix of ``min_p`` values (0 among them)."""
        return make_min_p_inputs(problem, seed=seed, device=device)

    def launch(self, inputs: MinPInputs, config: Mapping[str, int]) -> torch.Tensor:
        """The kernels with ``config`` into ``inputs.out``, without the checks that read
        tensor contents; returns ``inputs.out`` (overwritten by the next launch)."""
        apply_min_p(*inputs.args(), out=inputs.out, config=config, validate=False)
        return inputs.out

    def reference(self, inputs: MinPInputs) -> MinPReference:
        """The PyTorch reference's logits and near-ties."""
        return min_p_reference(*inputs.args())

    def same(self, expected: MinPReference | torch.Tensor, actual: torch.Tensor) -> bool:
        """Bit-identical logits; against a reference, a near-tie apart."""
        if isinstance(expected, MinPReference):
            return min_p_results_agree(expected, actual)[0]
        bits = torch.int32 if actual.dtype == torch.float32 else torch.int16
        return (expected.dtype == actual.dtype and expected.shape == actual.shape
                and torch.equal(expected.cpu().view(bits), actual.cpu().view(bits)))
