"""The plain PyTorch reference of the fused sampler, and its exactness rule.

The unfused chain of Model Runner V2's sampler, written out: float32 logits divided by
the temperature (unless it is 0 or 1), min-p's ``-inf`` below ``max + log(min_p)``, the
top-k/top-p reference (:mod:`spectune.kernels.sampling.top_k_top_p_ref`), then the
Gumbel-max reference (:mod:`spectune.kernels.sampling.gumbel_sample_ref`, vLLM's
noise from the host copy).

A row is a near-tie, and compared nowhere, when float rounding could change its token:
the Gumbel runner-up is that close (:data:`~spectune.kernels.sampling.GUMBEL_NEAR_TIE_RTOL`), or
a token whose fate the top-k/top-p reference calls ambiguous, or that sits within
:data:`MIN_P_RTOL` of the min-p threshold (the device's ``log`` may differ from torch's
by an ulp), would beat (or is) the winner. Not part of the family's source hash.
"""

from __future__ import annotations

import torch

from spectune.kernels._counter_rng_host import gumbel_noise
from spectune.kernels.sampling.gumbel_sample_ref import (
    GUMBEL_NEAR_TIE_RTOL,
    GumbelReference,
    gumbel_reference,
)
from spectune.kernels.sampling.top_k_top_p_ref import top_k_top_p_reference

__all__ = ["MIN_P_RTOL", "sample_reference"]

#: Relative distance to the min-p threshold within which a token may fall either side.
MIN_P_RTOL = 1e-6


def sample_reference(
    logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    min_p: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    pos: torch.Tensor,
    *,
    use_fp64: bool = False,
) -> GumbelReference:
    """Tokens of the unfused chain, and which rows are near-ties."""
    x = logits.detach().cpu().float().clone()
    rows, vocab = x.shape
    states = expanded_idx_mapping.detach().cpu().to(torch.int64)
    temps, mins = temperature.detach().cpu(), min_p.detach().cpu()
    unsure = torch.zeros(rows, vocab, dtype=torch.bool)
    for row in range(rows):
        state = int(states[row])
        if state < 0 or float(temps[state]) == 0.0:
            continue  # greedy: every step keeps the maximum
        if float(temps[state]) != 1.0:
            x[row] = x[row] / temps[state]
        if float(mins[state]) != 0.0:
            threshold = x[row].max() + torch.log(mins[state])
            unsure[row] = (x[row] - threshold).abs() <= MIN_P_RTOL * (1 + threshold.abs())
            x[row] = torch.where(x[row] < threshold, float("-inf"), x[row])
    safe = states.clamp(min=0)
    greedy = (states < 0) | (temps[safe] == 0)
    k = torch.where(greedy, vocab, top_k.detach().cpu().to(torch.int64)[safe])
    p = torch.where(greedy, 1.0, top_p.detach().cpu()[safe])
    masked = top_k_top_p_reference(x, k, p)
    unsure |= masked.ambiguous
    ref = gumbel_reference(masked.logits, expanded_idx_mapping, temperature, seed, pos,
                           apply_temperature=False, is_drafting=False, use_fp64=use_fp64)
    near = ref.near_tie.clone()
    seeds, positions = seed.detach().cpu(), pos.detach().cpu()
    for row in torch.nonzero(unsure.any(dim=1) & ~greedy).flatten().tolist():
        state = int(states[row])
        noise = gumbel_noise(int(seeds[state]), int(positions[row]), torch.arange(vocab),
                             fp64=use_fp64)
        score = x[row].double() + noise.double()
        best = float(score[int(ref.sampled[row])])
        rival = float(score[unsure[row]].max())
        near[row] |= rival >= best - GUMBEL_NEAR_TIE_RTOL * (1 + abs(best))
    return GumbelReference(sampled=ref.sampled, near_tie=near)
