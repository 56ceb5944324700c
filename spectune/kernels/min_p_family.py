"""Min-p filtering (MRV2's ``apply_min_p``) as a :class:`~spectune.kernels.KernelFamily`."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels import _launch, _reductions, min_p, min_p_space
from spectune.kernels._family import RowsFamily
from spectune.kernels.min_p_inputs import MinPInputs, make_min_p_inputs
from spectune.kernels.min_p_reference import MinPReference, min_p_reference, min_p_results_agree
from spectune.space import Problem

__all__ = ["FAMILY", "MinPFamily"]


class MinPFamily(RowsFamily):
    """Min-p filtering of logits rows, in place, as a tunable kernel family.

    The kernels work in place; :meth:`launch` writes into the inputs' ``out`` buffer
    instead (same kernels, same memory traffic), so the shared logits never change and
    the tuner's repeated launches all give the reference's result.

    Attributes:
        name: ``min_p``.
        source_modules: The kernels and launcher (:mod:`spectune.kernels.min_p`) and the
            shared row split (:mod:`spectune.kernels._reductions`).
        source_hash: Hash of their code.
    """

    name = "min_p"
    source_modules = (min_p, _reductions, _launch)
    space = min_p_space

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> MinPInputs:
        """``problem.batch`` rows at a mix of ``min_p`` values (0 among them)."""
        return make_min_p_inputs(problem, seed=seed, device=device)

    def launch(self, inputs: MinPInputs, config: Mapping[str, int]) -> torch.Tensor:
        """The kernels with ``config`` into ``inputs.out``, without the checks that read
        tensor contents; returns ``inputs.out`` (overwritten by the next launch)."""
        min_p.apply_min_p(*inputs.args(), out=inputs.out, config=config, validate=False)
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


#: The registered instance (see :data:`spectune.kernels.FAMILIES`).
FAMILY = MinPFamily()
