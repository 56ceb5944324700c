"""Verification with the sampling parameters folded in, as two kernel families.

``rejection_sample_folded`` (V1) and ``rejection_sample_mrv2_folded`` (Model Runner V2):
the verification kernels reading raw target logits and applying each request's
temperature, min-p, top-k and top-p as they load them (:mod:`spectune.kernels._folding`).
Their own families because their best configs differ (a threshold pre-pass, each pass
doing more per logit) and they have two more parameters; the same shapes as the unfolded
families'. Registered in :data:`spectune.kernels.FAMILIES`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from spectune.kernels import rejection_folded_space, rejection_mrv2_folded_space
from spectune.kernels.rejection_family import RejectionSampleFamily
from spectune.kernels.rejection_folded_reference import unfolded_mrv2, unfolded_v1
from spectune.kernels.rejection_inputs import RejectionInputs
from spectune.kernels.rejection_mrv2_family import RejectionSampleMrv2Family
from spectune.kernels.rejection_mrv2_inputs import Mrv2Inputs
from spectune.kernels.rejection_mrv2_reference import Mrv2Reference
from spectune.kernels.rejection_reference import ReferenceResult
from spectune.space import Problem

__all__ = [
    "MRV2_FOLDED",
    "V1_FOLDED",
    "RejectionSampleFoldedFamily",
    "RejectionSampleMrv2FoldedFamily",
    "draw_sampling_params",
]

# Realistic sampling parameters (what serving APIs are called with): temperature in
# [0.5, 1.5), top-p in [0.5, 1], top-k among these or none.
_TEMPERATURE_RANGE = (0.5, 1.5)
_TOP_P_RANGE = (0.5, 1.0)
_TOP_KS = (1, 5, 20, 50, 100, 1000)


def draw_sampling_params(
    count: int, vocab: int, *, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``count`` requests' temperature (float32), top-k (int32; ``vocab`` = none) and
    top-p (float32; 1 = none), a quarter of each left off."""
    lo, hi = _TEMPERATURE_RANGE
    temperature = lo + (hi - lo) * torch.rand(count, generator=generator)
    choices = torch.tensor([*_TOP_KS, vocab, vocab], dtype=torch.int32).clamp(max=vocab)
    top_k = choices[torch.randint(0, len(choices), (count,), generator=generator)]
    lo, hi = _TOP_P_RANGE
    top_p = lo + (hi - lo) * torch.rand(count, generator=generator)
    top_p = torch.where(torch.rand(count, generator=generator) < 0.25, 1.0, top_p)
    return temperature, top_k, top_p


class RejectionSampleFoldedFamily(RejectionSampleFamily):
    """V1 verification with temperature, top-k and top-p folded in.

    Attributes:
        name: ``rejection_sample_folded``.
        source_modules: The unfolded family's: the same kernels and launcher (which
            already hash the fold, :mod:`spectune.kernels._folding`, and the threshold
            search, :mod:`spectune.kernels._truncation`); rows are told apart by name.
    """

    name = "rejection_sample_folded"
    source_modules = RejectionSampleFamily.source_modules
    space = rejection_folded_space

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


class RejectionSampleMrv2FoldedFamily(RejectionSampleMrv2Family):
    """Model Runner V2 verification with temperature, min-p, top-k and top-p folded in.

    Attributes:
        name: ``rejection_sample_mrv2_folded``.
        source_modules: The unfolded family's (the same kernels and launcher).
    """

    name = "rejection_sample_mrv2_folded"
    source_modules = RejectionSampleMrv2Family.source_modules
    space = rejection_mrv2_folded_space

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


#: The registered instances (see :data:`spectune.kernels.FAMILIES`).
V1_FOLDED = RejectionSampleFoldedFamily()
MRV2_FOLDED = RejectionSampleMrv2FoldedFamily()
