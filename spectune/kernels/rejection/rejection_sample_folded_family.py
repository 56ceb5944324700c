"""The adapter of V1 verification with the sampling parameters folded in
(``rejection_sample_folded``).

The verification kernels reading raw target logits and applying each request's
temperature, min-p, top-k and top-p as they load them (:mod:`spectune.kernels._folding`).
Its own family because its best configs differ (a threshold pre-pass, each pass doing
more per logit) and it has two more parameters; the same shapes and kernels as
``rejection_sample`` (the same source hash). Registered in
:data:`spectune.kernels.FAMILIES`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from spectune.kernels._synthetic_inputs import draw_sampling_params
from spectune.kernels.rejection.rejection_sample_family import RejectionSampleFamily
from spectune.kernels.rejection.rejection_sample_folded_ref import unfolded_v1
from spectune.kernels.rejection.rejection_sample_inputs import RejectionInputs
from spectune.kernels.rejection.rejection_sample_ref import ReferenceResult
from spectune.space import Problem

__all__ = ["RejectionSampleFoldedFamily"]


class RejectionSampleFoldedFamily(RejectionSampleFamily):
    """V1 verification with temperature, top-k and top-p folded in."""

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> RejectionInputs:
        """The unfolded family's inputs (raw logits) and each request's parameters."""
        inputs = super().make_inputs(problem, seed=seed, device=device)
        generator = torch.Generator().manual_seed(seed + 1)
        temperature, top_k, top_p = draw_sampling_params(
            problem.batch, problem.vocab, generator=generator
        )
        return replace(inputs, temperature=temperature.to(device), top_k=top_k.to(device),
                       top_p=top_p.to(device))

    def reference(self, inputs: RejectionInputs) -> ReferenceResult:
        """The unfolded reference on the logits with the parameters applied first."""
        return super().reference(unfolded_v1(inputs))
