"""The rejection-sampling kernels as a :class:`~spectune.kernels.KernelFamily`.

What the tuner, the database and the vLLM plugin see of chain verification (greedy and
rejection sampling); registered in :data:`spectune.kernels.FAMILIES`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels import (
    _folding,
    _launch,
    _reductions,
    _truncation,
    rejection,
    rejection_constants,
    rejection_space,
)
from spectune.kernels._family import SpaceFamily
from spectune.kernels.rejection import rejection_sample
from spectune.kernels.rejection_inputs import RejectionInputs, make_inputs
from spectune.kernels.rejection_reference import (
    ReferenceResult,
    decision_margins_agree,
    rejection_sample_reference,
)
from spectune.kernels.rejection_space import problem_for
from spectune.space import Problem

__all__ = ["FAMILY", "RejectionSampleFamily"]


class RejectionSampleFamily(SpaceFamily):
    """Chain verification (greedy + rejection sampling) as a tunable kernel family.

    Attributes:
        name: ``rejection_sample``.
        source_modules: The code that decides tokens and timings: the kernels and their
            launcher (:mod:`spectune.kernels.rejection`), the numbers they share with
            host code (:mod:`spectune.kernels.rejection_constants`) and the shared
            reductions (:mod:`spectune.kernels._reductions`).
        source_hash: Hash of their code (:func:`spectune.kernels._code_hash.code_hash`).
    """

    name = "rejection_sample"
    source_modules = (rejection, rejection_constants, _reductions, _launch, _folding, _truncation)
    space = rejection_space

    def problem_of(self, inputs: RejectionInputs) -> Problem:
        """The problem ``inputs`` belong to (what the launcher's default config is for)."""
        return problem_for(
            max_spec_len=inputs.max_spec_len,
            batch=inputs.cu_num_draft_tokens.shape[0],
            vocab=inputs.target_logits.shape[-1],
            dtype=inputs.target_logits.dtype,
            draft_probs=inputs.draft_probs is not None,
        )

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> RejectionInputs:
        """Every request random with ``k`` drafts sampled from the drafter."""
        return make_inputs(problem, seed=seed, device=device)

    def launch(self, inputs: RejectionInputs, config: Mapping[str, int]) -> torch.Tensor:
        """The kernels with ``config``, without the checks that read tensor contents."""
        return rejection_sample(*inputs.args(), **inputs.kwargs(), config=config, validate=False)

    def reference(self, inputs: RejectionInputs) -> ReferenceResult:
        """The PyTorch reference's tokens and near-ties for ``inputs``."""
        return rejection_sample_reference(*inputs.args(), **inputs.kwargs())

    def same(self, expected: ReferenceResult | torch.Tensor, actual: torch.Tensor) -> bool:
        """Bit-identical tokens; against a reference, a near-tie apart (see NEAR_TIE_RTOL)."""
        if isinstance(expected, ReferenceResult):
            return decision_margins_agree(expected, actual)[0]
        return torch.equal(expected.cpu(), actual.cpu())


#: The registered instance (see :data:`spectune.kernels.FAMILIES`).
FAMILY = RejectionSampleFamily()
