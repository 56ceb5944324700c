"""The plain PyTorch reference of the rejection-sampling kernels, and its exactness rule.

Written from vLLM's semantics (its V1 ``rejection_sample`` on GPU: 0.32's, and 0.33's
FLy windows), not from the kernels: probabilities are ``torch.softmax`` in float32, as
vLLM computes them, and FLy's entropy is computed from them as vLLM's
``compute_fly_entropy`` does. The kernels' probabilities differ from those by a few ulps,
so a decision may differ where rounding decides a near-tie (:data:`NEAR_TIE_RTOL`);
:func:`decision_margins_agree` allows exactly that. Not part of the family's source hash.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spectune.kernels.rejection.rejection_sample_constants import PLACEHOLDER_TOKEN_ID
from spectune.kernels.rejection.rejection_sample_inputs import draw_random_inputs

__all__ = [
    "NEAR_TIE_RTOL",
    "ReferenceResult",
    "decision_margins_agree",
    "fly_entropy",
    "rejection_sample_reference",
]

#: Relative margin under which a decision counts as a near-tie that float rounding of
#: the softmax may decide either way (ours: fixed-point sum, torch: float32 tree sum).
NEAR_TIE_RTOL = 1e-5


@dataclass(frozen=True)
class ReferenceResult:
    """Reference tokens and, per output position, whether rounding could flip it.

    Attributes:
        tokens: ``[B, max_spec_len + 1]`` int32, as
            :func:`~spectune.kernels.rejection_sample` returns.
        near_tie: ``[B, max_spec_len + 1]`` bool; True where the decision emitted at
            that position (acceptance or recovered token) has a relative margin below
            :data:`NEAR_TIE_RTOL`, so float rounding of the softmax may decide it.
    """

    tokens: torch.Tensor
    near_tie: torch.Tensor


def rejection_sample_reference(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    *,
    max_spec_len: int,
    draft_probs: torch.Tensor | None = None,
    is_greedy: torch.Tensor | None = None,
    uniform_probs: torch.Tensor | None = None,
    inv_q: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
    fly_window_size: int | None = None,
    fly_entropy_threshold: float | None = None,
    fly_entropy_top_k: int = 3,
    rtol: float = NEAR_TIE_RTOL,
) -> ReferenceResult:
    """Plain PyTorch version of vLLM's V1 rejection sampling (GPU semantics): 0.32's,
    and with ``fly_window_size`` 0.33's FLy deferrals.

    Probabilities are ``torch.softmax`` in float32, as vLLM computes them; a row whose
    softmax is NaN (a NaN or +inf logit, or only -inf) rejects its draft and recovers
    token 0, its residual being 0 where NaN (see :func:`_recovered_token`). With
    ``seeds``, the random inputs are those of
    :func:`~spectune.kernels.rejection.rejection_sample_inputs.draw_random_inputs`. The
    arguments are those of :func:`~spectune.kernels.rejection_sample` (shapes, dtypes),
    and ``rtol``.

    Args:
        draft_token_ids: Drafts of all requests; ``-1`` marks a padded draft.
        cu_num_draft_tokens: Inclusive cumulative draft counts.
        target_logits: Target logits.
        bonus_token_ids: Bonus tokens.
        max_spec_len: Most drafts any request has.
        draft_probs: Drafter probabilities, if any.
        is_greedy: Greedy requests; ``None`` means all.
        uniform_probs: Acceptance coins.
        inv_q: Reciprocals of the exponential draws.
        seeds: Per-request seeds instead of ``uniform_probs`` and ``inv_q``.
        fly_window_size, fly_entropy_threshold, fly_entropy_top_k: vLLM 0.33's FLy
            (:mod:`spectune.kernels.rejection.rejection_sample_fly`); off without a window.
        rtol: Relative margin under which a decision is flagged as a near-tie. A FLy
            deferral is one where the entropy is within ``rtol * (1 + entropy)`` of the
            threshold, or where it rests on a later row's near-tie.
    """
    logits = target_logits.detach().cpu().float()
    n_rows, vocab = logits.shape
    cu = [int(c) for c in cu_num_draft_tokens.cpu()]
    batch = len(cu)
    drafts = draft_token_ids.cpu().to(torch.int64)
    bonus = bonus_token_ids.cpu().reshape(batch).to(torch.int64)
    if seeds is not None:
        uniform_probs, inv_q = draw_random_inputs(seeds, cu_num_draft_tokens, vocab=vocab)
    greedy = (
        [True] * batch if is_greedy is None else [bool(g) for g in is_greedy.cpu()]
    )
    argmax = logits.argmax(dim=-1) if n_rows else torch.empty(0, dtype=torch.int64)
    fly = fly_window_size is not None
    probs = torch.softmax(logits, dim=-1) if fly or not all(greedy) else None
    dprobs = draft_probs.detach().cpu().float() if draft_probs is not None else None
    coins = uniform_probs.cpu().double() if uniform_probs is not None else None
    inv_q_cpu = inv_q.cpu() if inv_q is not None else None
    entropy = fly_entropy(probs, fly_entropy_top_k) if fly and probs is not None else None

    tokens = torch.full(
        (batch, max_spec_len + 1), PLACEHOLDER_TOKEN_ID.value, dtype=torch.int32
    )
    near = torch.zeros((batch, max_spec_len + 1), dtype=torch.bool)
    start = 0
    for req in range(batch):
        end = cu[req]
        # The native test of every row (FLy reads later rows' before it decides).
        native: list[bool] = []
        native_near: list[bool] = []
        for row in range(start, end):
            d = int(drafts[row])
            if greedy[req]:
                native.append(d == int(argmax[row]))
                native_near.append(False)
                continue
            assert probs is not None and coins is not None
            dp_d = float(dprobs[row, d]) if (dprobs is not None and d >= 0) else 1.0
            accepted = tie = False
            if d >= 0 and dp_d > 0:
                ratio = float(torch.tensor(float(probs[row, d])) / torch.tensor(dp_d))
                u = float(coins[row])
                accepted = ratio >= u
                tie = abs(ratio - u) <= rtol * max(ratio, u)
            native.append(accepted)
            native_near.append(tie)
        rejected = False
        for pos, row in enumerate(range(start, end)):
            d = int(drafts[row])
            near[req, pos] = native_near[pos]
            accepted = native[pos]
            if not accepted and fly:
                assert entropy is not None and probs is not None
                deferred, tie = _fly_defers(
                    logits[row], probs[row], float(entropy[row]), d, dprobs, row,
                    greedy=greedy[req], ahead=native[pos + 1:], ahead_near=native_near[pos + 1:],
                    window=fly_window_size, threshold=fly_entropy_threshold, rtol=rtol,
                )
                near[req, pos] |= tie
                accepted = deferred
            if greedy[req]:
                token = d if accepted else int(argmax[row])
            elif accepted:
                token = d
            else:
                assert probs is not None and inv_q_cpu is not None
                token, tie = _recovered_token(
                    probs[row], None if dprobs is None else dprobs[row], d, inv_q_cpu[req], rtol
                )
                near[req, pos] |= tie
            tokens[req, pos] = token
            if not accepted:
                rejected = True
                break
        if not rejected:
            tokens[req, end - start] = int(bonus[req])
        start = end
    return ReferenceResult(tokens=tokens, near_tie=near)


def fly_entropy(probs: torch.Tensor, top_k: int) -> torch.Tensor:
    """FLy's top-``k`` entropy of each row of float32 probabilities, as vLLM 0.33 computes
    it: ``-sum p log p`` over the row's ``min(k, V)`` largest ``p`` (a zero ``p`` adds 0)."""
    top = torch.topk(probs, k=min(top_k, probs.shape[-1]), dim=-1).values
    terms = torch.where(top > 0, top * top.log(), torch.zeros_like(top))
    return -terms.sum(dim=-1)


def _fly_defers(
    logits: torch.Tensor, probs: torch.Tensor, entropy: float, draft: int,
    dprobs: torch.Tensor | None, row: int, *, greedy: bool, ahead: list[bool],
    ahead_near: list[bool], window: int, threshold: float | None, rtol: float,
) -> tuple[bool, bool]:
    """Whether FLy defers a natively rejected draft, and whether that is a near-tie."""
    assert threshold is not None
    vocab = logits.shape[-1]
    if not 0 <= draft < vocab or len(ahead) < window:
        return False, False
    if greedy:
        if not float(logits[draft]) > float("-inf"):
            return False, False
        unsure = False
    else:
        dp_d = float(dprobs[row, draft]) if dprobs is not None else 1.0
        p_d = float(probs[draft])
        if not dp_d > 0 or not (p_d > 0 or float(logits[draft]) > float("-inf")):
            return False, False
        # A finite logit whose probability underflows (or nearly) in torch's softmax.
        unsure = p_d < 2.0**-100
        if not p_d > 0:
            return False, unsure and all(ahead[:window])
    if not all(ahead[:window]):
        # Only a near-tie among the next decisions could let it defer.
        return False, any(ahead_near[:window]) and entropy >= threshold
    # vLLM compares float32 entropies with the threshold as a float32.
    limit = float(torch.tensor(threshold, dtype=torch.float32))
    unsure = unsure or abs(entropy - limit) <= rtol * (1.0 + abs(entropy))
    return entropy >= limit, unsure or any(ahead_near[:window])


def _recovered_token(
    p: torch.Tensor, dp: torch.Tensor | None, draft: int, inv_q: torch.Tensor, rtol: float
) -> tuple[int, bool]:
    if dp is not None:
        residual = torch.clamp(p - dp, min=0.0)
    else:
        residual = p.clone()
        if draft >= 0:
            residual[draft] = 0.0
    # A NaN residual (a row without a softmax: NaN, +inf or only -inf logits; a NaN draft
    # prob) is 0, as vLLM's tl.maximum(p - q, 0) makes it on a GPU (torch.clamp keeps it).
    residual = torch.where(residual.isnan(), 0.0, residual)
    score = residual.to(inv_q.dtype) * inv_q
    best = int(torch.argmax(score))
    top = torch.topk(score, k=min(2, score.numel())).values
    # A near-tie: the runner-up is within rtol of the winner, or every score is so small
    # that rounding of p decides it (an all-zero residual, p == dp).
    tie = top.numel() > 1 and float(top[0] - top[1]) <= rtol * float(top[0])
    return best, tie


def decision_margins_agree(
    expected: ReferenceResult, actual: torch.Tensor
) -> tuple[bool, str]:
    """Whether ``actual`` tokens equal the reference's, a near-tie apart.

    Each request must match position by position up to its first difference, and that
    difference must sit at or after a position the reference flagged as a near-tie (a
    flipped decision changes everything after it).

    Returns:
        ``(agree, why_not)``.
    """
    exp_tokens = expected.tokens
    act = actual.detach().cpu().to(torch.int32)
    if act.shape != exp_tokens.shape:
        return False, f"shape {list(act.shape)} != {list(exp_tokens.shape)}"
    diff = act != exp_tokens
    for req in torch.nonzero(diff.any(dim=1)).flatten().tolist():
        first = int(torch.nonzero(diff[req]).flatten()[0])
        if not bool(expected.near_tie[req, : first + 1].any()):
            return False, (
                f"request {req}: position {first} expected {exp_tokens[req].tolist()}, "
                f"got {act[req].tolist()} (no near-tie before it)"
            )
    return True, ""
