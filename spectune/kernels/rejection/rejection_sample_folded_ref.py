"""What folded V1 verification must equal: the sampling parameters applied first, then
the unfolded verification.

:func:`process_v1` writes the processed ``[N, V]`` float32 rows that V1's step before
verification writes (``apply_sampling_constraints``): temperature (torch's float32
division, bit-identical to vLLM's), then :func:`truncate`: min-p (spectune's
``apply_min_p``, bit-identical to Model Runner V2's) and top-k/top-p (spectune's
``top_k_top_p``, the sort-based definition's set up to the ambiguous tokens its tests
document; the same mask as the folded kernels' by construction). The folded family's
reference verifies those rows with the unfolded family's PyTorch reference. Model Runner
V2's folded reference truncates its rows the same way.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from spectune.kernels.rejection.rejection_sample_inputs import RejectionInputs

__all__ = ["process_v1", "truncate", "unfolded_v1"]


def truncate(
    logits: torch.Tensor, rows: torch.Tensor, *, min_p: torch.Tensor | None,
    top_k: torch.Tensor | None, top_p: torch.Tensor | None,
) -> torch.Tensor:
    """min-p, then top-k/top-p, on tempered float32 rows whose parameters are at ``rows``."""
    # The sampling kernels are imported here, not with the module: a worker that routes
    # folded verification loads this module with the family's adapter and never calls
    # the reference.
    from spectune.kernels.sampling.min_p import apply_min_p
    from spectune.kernels.sampling.top_k_top_p import top_k_top_p

    if min_p is not None:
        apply_min_p(logits, rows, min_p)
    if top_k is not None or top_p is not None:
        logits = top_k_top_p(
            logits, None if top_k is None else top_k[rows.long()],
            None if top_p is None else top_p[rows.long()],
        )
    return logits


def process_v1(inputs: RejectionInputs) -> torch.Tensor:
    """The target logits as V1 verifies them when its sampling parameters are applied
    first: every row divided by its request's temperature (1 for greedy requests, as
    vLLM), then min-p (Model Runner V2's; V1 has none) and top-k/top-p."""
    logits = inputs.target_logits.to(torch.float32).clone()
    cu = inputs.cu_num_draft_tokens.to(torch.int64)
    rows = torch.searchsorted(cu, torch.arange(logits.shape[0], device=cu.device), right=True)
    if inputs.temperature is not None:
        temp = inputs.temperature
        if inputs.is_greedy is not None:
            temp = torch.where(inputs.is_greedy, 1.0, temp)
        else:
            temp = torch.ones_like(temp)
        logits /= temp[rows].unsqueeze(-1)
    return truncate(logits, rows, min_p=inputs.min_p, top_k=inputs.top_k, top_p=inputs.top_p)


def unfolded_v1(inputs: RejectionInputs) -> RejectionInputs:
    """``inputs`` with the processed logits of :func:`process_v1` and no parameters."""
    return replace(inputs, target_logits=process_v1(inputs), temperature=None, top_k=None,
                   top_p=None, min_p=None)
