"""The plain PyTorch reference of top-k/top-p masking, and its exactness rule.

Written from vLLM 0.32's sort-based definition (``apply_top_k_top_p_pytorch``), in
float64 so that the reference itself does not round: top-k keeps every logit ``>=`` the
k-th largest; top-p, over what top-k kept, keeps a logit while the probability mass of
the logits strictly above it is under ``p``.

Which tokens may go either way (flagged as ambiguous, compared nowhere):

* the mass above a token is within :data:`TOP_P_MASS_TOL` of ``p`` (mass counted as a
  fraction of what top-k kept). vLLM's own float32 softmax and cumulative sum, and the
  kernels' float32 ``exp`` and fixed-point weights, move it by less than that;
* equal logits straddle the top-p boundary: the definition's unstable sort keeps some of
  them (which, it does not say); the kernels keep all of them.

Top-k is exact: a count, with no rounding. Not part of the family's source hash.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "TOP_P_MASS_TOL",
    "TopKTopPReference",
    "top_k_top_p_reference",
    "top_k_top_p_results_agree",
]

#: How close (as a fraction of the kept probability mass) the mass above a token may be
#: to ``p`` before float32 rounding may decide whether the token stays.
TOP_P_MASS_TOL = 1e-5


@dataclass(frozen=True)
class TopKTopPReference:
    """The reference's masked logits (the input's dtype, on CPU), which tokens are
    ambiguous (``[num_tokens, V]`` bool), and the logits as given."""

    logits: torch.Tensor
    ambiguous: torch.Tensor
    original: torch.Tensor


def top_k_top_p_reference(
    logits: torch.Tensor,
    k: torch.Tensor | None,
    p: torch.Tensor | None,
    *,
    tol: float = TOP_P_MASS_TOL,
) -> TopKTopPReference:
    """Masked logits per the sort-based definition (the input is not modified)."""
    original = logits.detach().cpu().clone()
    out = original.clone()
    rows, vocab = out.shape
    ambiguous = torch.zeros(rows, vocab, dtype=torch.bool)
    ks = [vocab] * rows if k is None else [int(v) for v in k.cpu()]
    ps = [1.0] * rows if p is None else [float(v) for v in p.cpu()]
    for row in range(rows):
        x = out[row].double()
        keep = torch.ones(vocab, dtype=torch.bool)
        if 1 <= ks[row] < vocab:
            kth = torch.sort(x, descending=True).values[ks[row] - 1]
            keep = x >= kth
        if ps[row] < 1.0 and bool(torch.isfinite(x[keep]).any()):
            keep, unsure = _top_p(x, keep, ps[row], tol)
            ambiguous[row] = unsure
        out[row][~keep] = float("-inf")
    return TopKTopPReference(logits=out, ambiguous=ambiguous, original=original)


def _top_p(
    x: torch.Tensor, keep: torch.Tensor, p: float, tol: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-p over the kept logits of one row (float64): kept and ambiguous tokens."""
    weights = torch.where(keep, torch.exp(x - x[keep].max()), 0.0)
    mass = weights / weights.sum()
    values, inverse = torch.unique(torch.where(keep, x, float("-inf")), return_inverse=True)
    group_mass = torch.zeros(len(values), dtype=torch.float64).index_add_(0, inverse, mass)
    # Mass strictly above each distinct value (unique sorts ascending).
    above = group_mass.flip(0).cumsum(0).flip(0) - group_mass
    above_token = above[inverse]
    kept = keep & (above_token < p)
    # Tokens of one value see masses from `above` up to `above + group - own` in the
    # definition's sorted order: ambiguous if p (give or take tol) falls in that range.
    top = above_token + group_mass[inverse] - mass
    unsure = keep & (above_token - tol <= p) & (p <= top + tol)
    return kept, unsure


def top_k_top_p_results_agree(
    expected: TopKTopPReference, actual: torch.Tensor
) -> tuple[bool, str]:
    """Whether ``actual`` equals the reference's masked logits bit for bit, but at its
    ambiguous tokens (where each token is either its input value or ``-inf``)."""
    got = actual.detach().cpu()
    want = expected.logits
    if got.shape != want.shape or got.dtype != want.dtype:
        return False, f"{list(got.shape)} {got.dtype} != {list(want.shape)} {want.dtype}"
    same = (got == want) | (torch.isnan(got) & torch.isnan(want))
    wrong = ~same & ~expected.ambiguous
    if bool(wrong.any()):
        row, col = (int(v) for v in torch.nonzero(wrong)[0])
        return False, (f"row {row}, token {col}: expected {float(want[row, col])}, got "
                       f"{float(got[row, col])} ({int(wrong.sum())} tokens differ)")
    # An ambiguous token is either as given or masked.
    as_given = (got == expected.original) | (torch.isnan(got) & torch.isnan(expected.original))
    masked = torch.isinf(got) & (got < 0)
    changed = expected.ambiguous & ~as_given & ~masked
    if bool(changed.any()):
        row, col = (int(v) for v in torch.nonzero(changed)[0])
        return False, f"row {row}, token {col}: ambiguous token became {float(got[row, col])}"
    return True, ""
