"""The adapter of Model Runner V2 verification (``rejection_sample_mrv2``): what the tuner,
the database and the vLLM plugin run of it (registered in
:data:`spectune.kernels.FAMILIES`, which holds its name, source hash and space)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_fly import rejection_sample_mrv2
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_inputs import (
    Mrv2Inputs,
    make_mrv2_inputs,
)
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_ref import (
    Mrv2Reference,
    mrv2_results_agree,
    rejection_sample_mrv2_reference,
)
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_space import problem_for
from spectune.space import Problem

__all__ = ["RejectionSampleMrv2Family"]


class RejectionSampleMrv2Family:
    """MRV2 chain verification (greedy + probability-ratio test): inputs, launch,
    reference, rule."""

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
        return rejection_sample_mrv2_reference(*inputs.args(), **inputs.fly_kwargs())

    def same(
        self,
        expected: Mrv2Reference | tuple[torch.Tensor, torch.Tensor],
        actual: tuple[torch.Tensor, torch.Tensor],
    ) -> bool:
        """Identical tokens and counts; against a reference, a near-tie apart."""
        if isinstance(expected, Mrv2Reference):
            return mrv2_results_agree(expected, actual)[0]
        return all(torch.equal(e.cpu(), a.cpu()) for e, a in zip(expected, actual, strict=True))
