"""The adapter of Model Runner V2 verification with the sampling parameters folded in
(``rejection_sample_mrv2_folded``).

The MRV2 verification kernels reading raw target logits and applying each request
state's temperature, min-p, top-k and top-p as they load them
(:mod:`spectune.kernels._folding`): what ``RejectionSampler._verify`` runs after
``apply_sampling_params``, in one step. Its own family for the reasons of V1's
(:mod:`spectune.kernels.rejection.rejection_sample_folded_family`); the same shapes and
kernels as ``rejection_sample_mrv2`` (the same source hash). Registered in
:data:`spectune.kernels.FAMILIES`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from spectune.kernels._synthetic_inputs import draw_sampling_params
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_family import (
    RejectionSampleMrv2Family,
)
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_folded_ref import (
    unfolded_mrv2,
)
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_inputs import Mrv2Inputs
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_ref import Mrv2Reference
from spectune.space import Problem

__all__ = ["RejectionSampleMrv2FoldedFamily"]


class RejectionSampleMrv2FoldedFamily(RejectionSampleMrv2Family):
    """Model Runner V2 verification with temperature, min-p, top-k and top-p folded in."""

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> Mrv2Inputs:
        """The unfolded family's inputs (raw logits) and each request state's parameters."""
        inputs = super().make_inputs(problem, seed=seed, device=device)
        generator = torch.Generator().manual_seed(seed + 1)
        states = inputs.temperature.shape[0]
        temperature, top_k, top_p = draw_sampling_params(
            states, problem.vocab, generator=generator
        )
        return replace(inputs, temperature=temperature.to(device), apply_sampling_params=True,
                       top_k=top_k.to(device), top_p=top_p.to(device))

    def reference(self, inputs: Mrv2Inputs) -> Mrv2Reference:
        """The unfolded reference on the logits with the parameters applied first."""
        return super().reference(unfolded_mrv2(inputs))
