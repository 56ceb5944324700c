"""MRV2 verification as a :class:`~spectune.kernels.KernelFamily`.

What the tuner, the database and the vLLM plugin see of Model Runner V2's verification
kernels; registered in :data:`spectune.kernels.FAMILIES`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels import (
    _counter_rng,
    _folding,
    _launch,
    _reductions,
    _truncation,
    rejection_constants,
    rejection_mrv2,
    rejection_mrv2_constants,
    rejection_mrv2_space,
)
from spectune.kernels._family import SpaceFamily
from spectune.kernels.rejection_mrv2 import rejection_sample_mrv2
from spectune.kernels.rejection_mrv2_inputs import Mrv2Inputs, make_mrv2_inputs
from spectune.kernels.rejection_mrv2_reference import (
    Mrv2Reference,
    mrv2_results_agree,
    rejection_sample_mrv2_reference,
)
from spectune.kernels.rejection_mrv2_space import problem_for
from spectune.space import Problem

__all__ = ["FAMILY", "RejectionSampleMrv2Family"]


class RejectionSampleMrv2Family(SpaceFamily):
    """MRV2 chain verification (greedy + probability-ratio test) as a tunable family.

    Attributes:
        name: ``rejection_sample_mrv2``.
        source_modules: The code that decides tokens and timings: the kernels and their
            launcher (:mod:`spectune.kernels.rejection_mrv2`), the numbers they share
            with host code (:mod:`spectune.kernels.rejection_mrv2_constants`, and the
            fixed-point width of :mod:`spectune.kernels.rejection_constants`), vLLM's
            random streams (:mod:`spectune.kernels._counter_rng`) and the shared
            reductions (:mod:`spectune.kernels._reductions`).
        source_hash: Hash of their code (:func:`spectune.kernels._code_hash.code_hash`).
    """

    name = "rejection_sample_mrv2"
    source_modules = (
        rejection_mrv2, rejection_mrv2_constants, _counter_rng, rejection_constants,
        _reductions, _launch, _folding, _truncation,
    )
    space = rejection_mrv2_space

    def problem_of(self, inputs: Mrv2Inputs) -> Problem:
        """The problem ``inputs`` belong to (what the launcher's default config is for)."""
        return problem_for(
            num_speculative_steps=inputs.num_speculative_steps,
            num_reqs=inputs.cu_num_logits.shape[0] - 1,
            vocab=inputs.target_logits.shape[-1],
            dtype=inputs.target_logits.dtype,
            draft_logits=inputs.draft_logits is not None,
        )

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> Mrv2Inputs:
        """Every request random (temperature 1) with ``k`` drafts sampled from the drafter."""
        return make_mrv2_inputs(problem, seed=seed, device=device)

    def launch(
        self, inputs: Mrv2Inputs, config: Mapping[str, int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernels with ``config``, without the checks that read tensor contents."""
        return rejection_sample_mrv2(
            *inputs.args(), **inputs.kwargs(), config=config, validate=False
        )

    def reference(self, inputs: Mrv2Inputs) -> Mrv2Reference:
        """The PyTorch reference's tokens and near-ties for ``inputs``."""
        return rejection_sample_mrv2_reference(*inputs.args())

    def same(
        self,
        expected: Mrv2Reference | tuple[torch.Tensor, torch.Tensor],
        actual: tuple[torch.Tensor, torch.Tensor],
    ) -> bool:
        """Identical tokens and counts; against a reference, a near-tie apart."""
        if isinstance(expected, Mrv2Reference):
            return mrv2_results_agree(expected, actual)[0]
        return all(torch.equal(e.cpu(), a.cpu()) for e, a in zip(expected, actual, strict=True))


#: The registered instance (see :data:`spectune.kernels.FAMILIES`).
FAMILY = RejectionSampleMrv2Family()
