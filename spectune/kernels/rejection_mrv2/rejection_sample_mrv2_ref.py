"""The plain PyTorch reference of MRV2 verification, and its exactness rule.

Written from vLLM's MRV2 semantics (0.32's, and 0.33's FLy windows), not from the
kernels: log-probabilities and FLy's entropy in float64 (exact to the float32 inputs,
where vLLM and our kernels both carry float32 values a few ulps off), the random numbers
of :mod:`spectune.kernels._counter_rng_host`. Greedy tokens are exact. A random
decision, or FLy's entropy test, is flagged as a near-tie when float32 rounding could
decide it (:data:`MRV2_NEAR_TIE_RTOL`); :func:`mrv2_results_agree` allows a difference
there and nowhere else. Not part of the family's source hash.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spectune.kernels._counter_rng_host import coins, gumbel_noise
from spectune.kernels._vllm_version import resolve_vllm_version
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
    fly_window_size: int = 0,
    fly_entropy_threshold: float = 0.3,
    fly_entropy_top_k: int = 3,
    vllm_version: str | None = None,
    rtol: float = MRV2_NEAR_TIE_RTOL,
) -> Mrv2Reference:
    """Plain PyTorch MRV2 verification; the arguments of
    :func:`~spectune.kernels.rejection_sample_mrv2` (FLy windows included), and ``rtol``.

    ``expanded_idx_mapping`` and ``expanded_local_pos`` are taken as consistent with
    ``idx_mapping`` and ``cu_num_logits`` (the launcher checks that).
    """
    del expanded_idx_mapping, expanded_local_pos
    if fly_window_size and resolve_vllm_version(vllm_version) == "0.32":
        raise ValueError("FLy windows are vLLM 0.33 semantics")
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
        if fly_window_size:
            row_of = _Rows(target=target, draft=draft, drafts=drafts, positions=positions,
                           state=state, temp=float(temp), seed=seeds[state],
                           use_fp64=use_fp64, rtol=rtol)
            emitted, ties = _fly_request(
                row_of, start, n_drafts, window=fly_window_size,
                threshold=float(torch.tensor(fly_entropy_threshold, dtype=torch.float32)),
                top_k=fly_entropy_top_k,
            )
            sampled[req, : len(emitted)] = torch.tensor(emitted, dtype=torch.int64)
            num_sampled[req] = len(emitted)
            near[req, : len(ties)] = torch.tensor(ties, dtype=torch.bool)
            continue
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


@dataclass(frozen=True)
class _Rows:
    """One request's rows and random streams, for the FLy walk."""

    target: torch.Tensor
    draft: torch.Tensor | None
    drafts: torch.Tensor
    positions: torch.Tensor
    state: int
    temp: float
    seed: int
    use_fp64: bool
    rtol: float

    def log_probs(self, row: int, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """float64 target and draft log-probabilities of a row (draft: ``None`` without
        draft logits)."""
        x = self.target[row].double()
        t_logp = x - torch.logsumexp(x, 0)
        if self.draft is None:
            return t_logp, None
        # Divided in float32 as the kernels do, then exact from there.
        vocab = self.target.shape[1]
        y = (self.draft[self.state, step, :vocab].float() / self.temp).double()
        return t_logp, y - torch.logsumexp(y, 0)

    def native(self, row: int, step: int) -> tuple[bool, bool, bool]:
        """A draft's native test: (accepted, deferrable, near-tie)."""
        d = int(self.drafts[row + 1])
        if d < 0:
            return False, False, False
        if self.temp == 0.0:
            x = self.target[row]
            return int(torch.argmax(x)) == d, bool(x[d] > -math.inf), False
        t_logp, d_logp = self.log_probs(row, step)
        coin = float(coins(self.seed, self.positions[row : row + 1])[0])
        d_value = 0.0 if d_logp is None else float(d_logp[d])
        rhs = math.log(coin) + d_value
        margin = float(t_logp[d]) - rhs
        scale = 1.0 + abs(float(t_logp[d])) + abs(rhs)
        deferrable = float(t_logp[d]) > -math.inf and d_value > -math.inf
        return margin > 0, deferrable, abs(margin) <= self.rtol * scale

    def stop_token(self, row: int, step: int, is_draft_row: bool) -> tuple[int, bool]:
        """The token emitted where the chain stops (a rejected draft, a placeholder, the
        bonus row), and whether it is a near-tie."""
        x = self.target[row]
        if self.temp == 0.0:
            return int(torch.argmax(x)), False
        vocab = x.shape[0]
        noise = gumbel_noise(self.seed, int(self.positions[row]), torch.arange(vocab),
                             fp64=self.use_fp64)
        d = int(self.drafts[row + 1]) if is_draft_row else -1
        if d < 0:
            return _gumbel_argmax(x.double(), noise, None, self.rtol)
        t_logp, d_logp = self.log_probs(row, step)
        if d_logp is None:
            residual = x.double().clone()
            residual[d] = -math.inf
            return _gumbel_argmax(residual, noise, None, self.rtol)
        return _gumbel_argmax(t_logp, noise, d_logp, self.rtol)

    def entropy(self, row: int, top_k: int) -> float:
        """FLy's top-k entropy of the target row, in float64."""
        x = self.target[row].double()
        top = torch.topk(x, k=min(top_k, x.shape[0])).values
        log_probs = top - torch.logsumexp(x, 0)
        probs = log_probs.exp()
        return -float(torch.where(probs > 0, probs * log_probs, 0.0).sum())


def _fly_request(
    rows: _Rows, start: int, n_drafts: int, *, window: int, threshold: float, top_k: int
) -> tuple[list[int], list[bool]]:
    """One request under FLy windows: its tokens, and per output position whether a
    near-tie decided something there or after."""
    ties = [False] * (n_drafts + 1)
    accepted_len, pending = 0, -1
    for step in range(n_drafts):
        row = start + step
        accepted, deferrable, tie = rows.native(row, step)
        # Whatever this decision changes starts at the first position not yet confirmed.
        ties[accepted_len] |= tie
        if pending >= 0:
            if not accepted:
                break
            if step - pending == window:
                accepted_len, pending = step + 1, -1
        elif accepted:
            accepted_len = step + 1
        else:
            entropy = rows.entropy(row, top_k)
            ties[accepted_len] |= abs(entropy - threshold) <= rows.rtol * (1.0 + abs(threshold))
            if not (deferrable and step + window < n_drafts and entropy >= threshold):
                break
            pending = step
    emitted = [int(rows.drafts[start + 1 + step]) for step in range(accepted_len)]
    token, tie = rows.stop_token(start + accepted_len, accepted_len, accepted_len < n_drafts)
    ties[accepted_len] |= tie
    return [*emitted, token], ties


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
