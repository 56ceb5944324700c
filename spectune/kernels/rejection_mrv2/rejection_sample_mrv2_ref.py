"""The plain PyTorch reference of MRV2 verification, and its exactness rule.

Written from vLLM 0.32's MRV2 semantics, not from the kernels: log-probabilities in
float64 (exact to the float32 inputs, where vLLM and our kernels both carry float32
normalisers a few ulps off), the random numbers of
:mod:`spectune.kernels._counter_rng_host`. Greedy tokens are exact. A random
decision is flagged as a near-tie when float32 rounding could decide it
(:data:`MRV2_NEAR_TIE_RTOL`); :func:`mrv2_results_agree` allows a difference there and
nowhere else. Not part of the family's source hash.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spectune.kernels._counter_rng_host import coins, gumbel_noise
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_constants import PLACEHOLDER_TOKEN_ID

__all__ = [
    "MRV2_NEAR_TIE_RTOL",
    "Mrv2Reference",
    "mrv2_results_agree",
    "rejection_sample_mrv2_reference",
]

#: Margin, relative to the magnitudes a decision is computed from (plus 1, as those are
#: logits and log-probabilities), under which float32 rounding of a normaliser, a
#: ``log1p`` or a ``log`` may decide it either way: a flagged near-tie.
MRV2_NEAR_TIE_RTOL = 1e-5


@dataclass(frozen=True)
class Mrv2Reference:
    """Reference output and, per output position, whether rounding could flip it.

    Attributes:
        sampled: ``[num_reqs, k + 1]`` int64 tokens, ``-1`` past each count.
        num_sampled: ``[num_reqs]`` int32 counts.
        near_tie: ``[num_reqs, k + 1]`` bool: True where the decision made at that
            position (acceptance or resampled token) has a margin under
            :data:`MRV2_NEAR_TIE_RTOL`.
    """

    sampled: torch.Tensor
    num_sampled: torch.Tensor
    near_tie: torch.Tensor


def rejection_sample_mrv2_reference(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_sampled: torch.Tensor,
    cu_num_logits: torch.Tensor,
    pos: torch.Tensor,
    idx_mapping: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    expanded_local_pos: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    num_speculative_steps: int,
    use_fp64: bool = False,
    *,
    rtol: float = MRV2_NEAR_TIE_RTOL,
) -> Mrv2Reference:
    """Plain PyTorch MRV2 verification; the arguments of
    :func:`~spectune.kernels.rejection_sample_mrv2`, and ``rtol``.

    ``expanded_idx_mapping`` and ``expanded_local_pos`` are taken as consistent with
    ``idx_mapping`` and ``cu_num_logits`` (the launcher checks that).
    """
    del expanded_idx_mapping, expanded_local_pos
    target = target_logits.detach().cpu().float()
    vocab = target.shape[1]
    drafts = draft_sampled.detach().cpu().to(torch.int64)
    cu = [int(c) for c in cu_num_logits.cpu()]
    positions = pos.detach().cpu().to(torch.int64)
    states = [int(s) for s in idx_mapping.cpu()]
    temps = temperature.detach().cpu().float()
    seeds = [int(s) for s in seed.cpu()]
    draft = None if draft_logits is None else draft_logits.detach().cpu()
    steps = num_speculative_steps
    num_reqs = len(cu) - 1

    sampled = torch.full((num_reqs, steps + 1), PLACEHOLDER_TOKEN_ID.value, dtype=torch.int64)
    num_sampled = torch.zeros(num_reqs, dtype=torch.int32)
    near = torch.zeros((num_reqs, steps + 1), dtype=torch.bool)
    for req in range(num_reqs):
        start, end = cu[req], cu[req + 1]
        state = states[req]
        temp = temps[state]
        n_drafts = end - start - 1
        emitted: list[int] = []
        for step in range(n_drafts + 1):
            row = start + step
            x = target[row]
            if float(temp) == 0.0:
                token = int(torch.argmax(x))
                if step < n_drafts and int(drafts[row + 1]) == token:
                    emitted.append(token)
                    continue
                emitted.append(token)
                break
            noise = gumbel_noise(seeds[state], int(positions[row]), torch.arange(vocab),
                                 fp64=use_fp64)
            d = int(drafts[row + 1]) if step < n_drafts else -1
            if d < 0:
                token, tie = _gumbel_argmax(x.double(), noise, None, rtol)
                emitted.append(token)
                near[req, step] = tie
                break
            t_logp = x.double() - torch.logsumexp(x.double(), 0)
            if draft is not None:
                # Divided in float32 as the kernels do, then exact from there.
                y = (draft[state, step, :vocab].float() / temp).double()
                d_logp = y - torch.logsumexp(y, 0)
            else:
                d_logp = None
            coin = float(coins(seeds[state], positions[row : row + 1])[0])
            rhs = math.log(coin) + (0.0 if d_logp is None else float(d_logp[d]))
            margin = float(t_logp[d]) - rhs
            scale = 1.0 + abs(float(t_logp[d])) + abs(rhs)
            near[req, step] = abs(margin) <= rtol * scale
            if margin > 0:
                emitted.append(d)
                continue
            if d_logp is None:
                residual = x.double().clone()
                residual[d] = -math.inf
                token, tie = _gumbel_argmax(residual, noise, None, rtol)
            else:
                token, tie = _gumbel_argmax(t_logp, noise, d_logp, rtol)
            near[req, step] |= tie
            emitted.append(token)
            break
        sampled[req, : len(emitted)] = torch.tensor(emitted, dtype=torch.int64)
        num_sampled[req] = len(emitted)
    return Mrv2Reference(sampled=sampled, num_sampled=num_sampled, near_tie=near)


def _gumbel_argmax(
    base: torch.Tensor, noise: torch.Tensor, d_logp: torch.Tensor | None, rtol: float
) -> tuple[int, bool]:
    """Argmax of residual + noise; the residual is ``base`` (logits, some -inf), or
    log(p - q) from ``base`` = log p and ``d_logp`` = log q. Returns (token, near-tie)."""
    if d_logp is None:
        residual = base
        error = rtol * (1.0 + base.abs())
    else:
        log_ratio = d_logp - base
        kept = log_ratio < 0
        ratio = torch.exp(torch.where(kept, log_ratio, torch.zeros_like(log_ratio)))
        residual = torch.where(kept, base + torch.log1p(-ratio), -math.inf)
        # log(1 - r) magnifies an error e in log r by r / (1 - r).
        error = rtol * (1.0 + base.abs() + d_logp.abs()) * (1.0 + ratio / (1.0 - ratio))
    score = residual + noise.double()
    best = int(torch.argmax(score))
    top = float(score[best])
    if top == -math.inf:
        # Nothing left in the residual (p <= q everywhere): vLLM emits token 0, and so do
        # we, unless rounding leaves an ulp-sized residual somewhere.
        return best, True
    error = torch.where(torch.isfinite(score), error + noise.double().abs() * rtol, 0.0)
    rivals = score + error >= top - float(error[best])
    rivals[best] = False
    return best, bool(rivals.any())


def mrv2_results_agree(
    expected: Mrv2Reference, actual: tuple[torch.Tensor, torch.Tensor]
) -> tuple[bool, str]:
    """Whether ``actual`` ``(sampled, num_sampled)`` equal the reference's, a near-tie apart.

    Each request's emitted tokens must match up to their first difference (a different
    token or count), and that difference must sit at or after a flagged near-tie.

    Returns:
        ``(agree, why_not)``.
    """
    sampled, counts = (t.detach().cpu() for t in actual)
    if tuple(sampled.shape) != tuple(expected.sampled.shape):
        return False, f"sampled shape {list(sampled.shape)} != {list(expected.sampled.shape)}"
    for req in range(sampled.shape[0]):
        ours = sampled[req, : int(counts[req])].tolist()
        ref = expected.sampled[req, : int(expected.num_sampled[req])].tolist()
        if ours == ref:
            continue
        first = next(
            (i for i, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b),
            min(len(ours), len(ref)),
        )
        limit = min(first, expected.near_tie.shape[1] - 1)
        if not bool(expected.near_tie[req, : limit + 1].any()):
            return False, (
                f"request {req}: expected {ref}, got {ours} (first difference at position "
                f"{first}, no near-tie before it)"
            )
    return True, ""
