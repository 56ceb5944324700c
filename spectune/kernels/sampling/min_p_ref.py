"""The plain PyTorch reference of min-p filtering, and its exactness rule.

Written from vLLM 0.32's MRV2 ``apply_min_p`` semantics. The row max is exact and the
threshold ``max + log(min_p)`` is float32 as in the kernels, but PyTorch's ``log`` may
differ from the device's ``tl.log`` by an ulp: a logit within
:data:`MIN_P_NEAR_TIE_RTOL` (relative to ``1 + |threshold|``) of the threshold is
flagged as a near-tie, where either outcome (kept or ``-inf``) agrees; every other
logit must be bit-identical. (A threshold that is infinite, or the row max itself at
``min_p`` 1, leaves no room for a device's ``log``: nothing is flagged there.) Not part
of the family's source hash.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MIN_P_NEAR_TIE_RTOL", "MinPReference", "min_p_reference", "min_p_results_agree"]

#: Distance to the threshold (relative to 1 + |threshold|) under which an ulp of ``log``
#: may decide whether a logit is kept.
MIN_P_NEAR_TIE_RTOL = 1e-5

# An integer dtype of each float dtype's width: bit patterns compared, so -0.0 != 0.0.
_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


@dataclass(frozen=True)
class MinPReference:
    """Expected logits ``[num_tokens, V]`` (on CPU, the logits' dtype), and which of them
    are near-ties: those are kept in ``logits``, and ``-inf`` agrees as well."""

    logits: torch.Tensor
    near_tie: torch.Tensor


def min_p_reference(
    logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    min_p: torch.Tensor,
    *,
    rtol: float = MIN_P_NEAR_TIE_RTOL,
) -> MinPReference:
    """Plain PyTorch ``apply_min_p``, out of place.

    A row is filtered unless its state is ``-1`` (padded) or its ``min_p`` is 0.
    """
    out = logits.detach().cpu().clone()
    near = torch.zeros(out.shape, dtype=torch.bool)
    states = [int(s) for s in expanded_idx_mapping.detach().cpu()]
    values = min_p.detach().cpu().float()
    for row, state in enumerate(states):
        if state < 0 or float(values[state]) == 0.0:
            continue
        x = out[row].float()
        log_p = torch.log(values[state])
        threshold = x.max() + log_p  # float32, as the kernels add
        # An infinite threshold (a row max of +-inf) decides every logit exactly, and so
        # does min_p 1 (log 1 is 0 on every device: the threshold is the row max).
        close = (torch.isfinite(threshold) & (log_p != 0.0)) & (
            (x - threshold).abs() <= rtol * (1.0 + threshold.abs())
        )
        near[row] = close
        out[row] = torch.where((x < threshold) & ~close, float("-inf"), x).to(out.dtype)
    return MinPReference(logits=out, near_tie=near)


def min_p_results_agree(expected: MinPReference, actual: torch.Tensor) -> tuple[bool, str]:
    """Whether ``actual`` logits are bit-identical to the reference's but at flagged
    near-ties (where ``-inf`` agrees too)."""
    got = actual.detach().cpu()
    want = expected.logits
    if got.dtype != want.dtype or got.shape != want.shape:
        return False, f"{got.dtype} {list(got.shape)} != {want.dtype} {list(want.shape)}"
    bits = _BITS[got.dtype]
    wrong = got.view(bits) != want.view(bits)
    wrong &= ~(expected.near_tie & (got == float("-inf")))
    if bool(wrong.any()):
        row, col = (int(i) for i in torch.nonzero(wrong)[0])
        return False, (f"[{row}, {col}]: expected {float(want[row, col])!r}, got "
                       f"{float(got[row, col])!r} ({int(wrong.sum())} differ, no near-tie)")
    return True, ""
