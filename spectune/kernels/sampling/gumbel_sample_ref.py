"""The plain PyTorch reference of Gumbel-max sampling, and its exactness rule.

Written from vLLM's MRV2 ``gumbel_sample`` semantics (0.32 and 0.33); the noise from
:mod:`spectune.kernels._counter_rng_host`, whose ``log`` may differ from the device's by
an ulp: a token is flagged as a near-tie when the runner-up's score is that close
(:data:`GUMBEL_NEAR_TIE_RTOL`). Not part of the family's source hash.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spectune.kernels._counter_rng import DRAFT_NOISE_SALT
from spectune.kernels._counter_rng_host import gumbel_noise
from spectune.kernels._vllm_version import resolve_vllm_version

__all__ = [
    "GUMBEL_NEAR_TIE_RTOL",
    "GumbelReference",
    "gumbel_reference",
    "gumbel_results_agree",
]

#: Score margin (relative to 1 + |score|) under which float rounding of the noise may
#: decide the argmax either way.
GUMBEL_NEAR_TIE_RTOL = 1e-5


@dataclass(frozen=True)
class GumbelReference:
    """Reference tokens ``[num_tokens]`` int64, and which rows are near-ties."""

    sampled: torch.Tensor
    near_tie: torch.Tensor


def gumbel_reference(
    logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    pos: torch.Tensor,
    apply_temperature: bool,
    is_drafting: bool,
    logits_cache: torch.Tensor | None = None,
    logits_cache_col: torch.Tensor | None = None,
    use_fp64: bool = False,
    logits_cache_source: torch.Tensor | None = None,
    *,
    vllm_version: str | None = None,
    rtol: float = GUMBEL_NEAR_TIE_RTOL,
) -> GumbelReference:
    """Plain PyTorch ``gumbel_sample`` (the logits cache's copy is not modelled; with
    vLLM 0.33's semantics its column is mixed into each row's seed, as vLLM does)."""
    del logits_cache_source
    x_all = logits.detach().cpu().float()
    states = [int(s) for s in expanded_idx_mapping.cpu()]
    temps = temperature.detach().cpu().float()
    seeds = [int(s) for s in seed.cpu()]
    positions = [int(p) for p in pos.cpu()]
    cols = [0] * len(states)
    if logits_cache is not None and resolve_vllm_version(vllm_version) != "0.32":
        assert logits_cache_col is not None
        col = logits_cache_col.cpu().to(torch.int64)
        cols = col.tolist() if col.dim() else [int(col)] * len(states)
    vocab = x_all.shape[1]
    tokens = torch.arange(vocab)
    sampled = torch.empty(len(states), dtype=torch.int64)
    near = torch.zeros(len(states), dtype=torch.bool)
    for row, state in enumerate(states):
        x = x_all[row]
        temp = float(temps[state]) if state >= 0 else 0.0
        if temp == 0.0:
            sampled[row] = int(torch.argmax(x))  # exact: no noise, first index on ties
            continue
        if apply_temperature:
            x = x / temps[state]  # float32, as the kernels divide
        position = positions[row] + (DRAFT_NOISE_SALT.value if is_drafting else 0)
        # Python ints xor as int64 do (two's complement) and stay within int64 here.
        noise = gumbel_noise(seeds[state] ^ (cols[row] << 32), position, tokens, fp64=use_fp64)
        score = x.double() + noise.double()
        best = int(torch.argmax(score))
        top = float(score[best])
        if top == -math.inf:
            sampled[row], near[row] = best, True
            continue
        rivals = score >= top - rtol * (1.0 + abs(top))
        rivals[best] = False
        sampled[row], near[row] = best, bool(rivals.any())
    return GumbelReference(sampled=sampled, near_tie=near)


def gumbel_results_agree(expected: GumbelReference, actual: torch.Tensor) -> tuple[bool, str]:
    """Whether ``actual`` tokens equal the reference's but at flagged near-ties."""
    got = actual.detach().cpu().to(torch.int64)
    if got.shape != expected.sampled.shape:
        return False, f"shape {list(got.shape)} != {list(expected.sampled.shape)}"
    wrong = (got != expected.sampled) & ~expected.near_tie
    if bool(wrong.any()):
        row = int(torch.nonzero(wrong)[0])
        return False, (f"row {row}: expected {int(expected.sampled[row])}, got "
                       f"{int(got[row])} (no near-tie)")
    return True, ""
