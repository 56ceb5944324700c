"""Synthetic inputs several kernel families draw: peaked logits, sampling parameters.

Not part of any source hash: nothing here decides the kernels' tokens or timings for
given inputs.
"""

from __future__ import annotations

import math

import torch

__all__ = ["draw_sampling_params", "peaked_logits"]

# Shape of the synthetic logits (see peaked_logits): every pass of the kernels runs.
_LOGIT_SCALE = 2.0
_LOGIT_PEAK_OVER_LOG_V = 4.0
_PEAKS = 4
_DRAFT_NOISE = 1.0


def peaked_logits(
    rows: int, vocab: int, *, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Realistic float32 target logits ``[rows, vocab]`` and a drafter's view of them.

    A few dominant tokens (together ~95% of the mass, at any vocabulary size) over a
    Gaussian floor; the drafter's logits are the target's plus noise, so drafts sampled
    from them are accepted at realistic rates and some are rejected.
    """
    logits = torch.randn(rows, vocab, generator=generator) * _LOGIT_SCALE
    peaks = torch.randint(0, vocab, (rows, _PEAKS), generator=generator)
    height = math.log(vocab) + _LOGIT_PEAK_OVER_LOG_V
    logits.scatter_add_(1, peaks, torch.full((rows, _PEAKS), height))
    draft_logits = logits + torch.randn(rows, vocab, generator=generator) * _DRAFT_NOISE
    return logits, draft_logits


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
