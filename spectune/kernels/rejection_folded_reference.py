"""What folded verification must equal: the sampling parameters applied first, then the
unfolded verification.

:func:`process_v1` and :func:`process_mrv2` write the processed ``[N, V]`` float32 rows
that vLLM's step before verification writes (V1's ``apply_sampling_constraints``, Model
Runner V2's ``Sampler.apply_sampling_params``): temperature (torch's float32 division for
V1, spectune's ``apply_temperature`` for MRV2, both bit-identical to vLLM's), min-p
(spectune's ``apply_min_p``, bit-identical to MRV2's) and top-k/top-p (spectune's
``top_k_top_p``, the sort-based definition's set up to the ambiguous tokens its tests
document; the same mask as the folded kernels' by construction). The folded families'
references verify those rows with the unfolded families' PyTorch references.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from spectune.kernels.min_p import apply_min_p
from spectune.kernels.rejection_inputs import RejectionInputs
from spectune.kernels.rejection_mrv2_inputs import Mrv2Inputs
from spectune.kernels.temperature import apply_temperature
from spectune.kernels.topk_topp import top_k_top_p

__all__ = ["process_mrv2", "process_v1", "unfolded_mrv2", "unfolded_v1"]


def _truncate(
    logits: torch.Tensor, rows: torch.Tensor, *, min_p: torch.Tensor | None,
    top_k: torch.Tensor | None, top_p: torch.Tensor | None,
) -> torch.Tensor:
    """min-p, then top-k/top-p, on tempered float32 rows whose parameters are at ``rows``."""
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
    return _truncate(logits, rows, min_p=inputs.min_p, top_k=inputs.top_k, top_p=inputs.top_p)


def unfolded_v1(inputs: RejectionInputs) -> RejectionInputs:
    """``inputs`` with the processed logits of :func:`process_v1` and no parameters."""
    return replace(inputs, target_logits=process_v1(inputs), temperature=None, top_k=None,
                   top_p=None, min_p=None)


def process_mrv2(inputs: Mrv2Inputs) -> torch.Tensor:
    """The target logits as Model Runner V2's ``apply_sampling_params`` leaves them (no
    logits processors): a float32 copy, tempered, then min-p and top-k/top-p."""
    logits = inputs.target_logits.to(torch.float32).clone()
    if not inputs.apply_sampling_params:
        return logits
    rows = inputs.expanded_idx_mapping
    apply_temperature(logits, rows, inputs.temperature)
    return _truncate(logits, rows, min_p=inputs.min_p, top_k=inputs.top_k, top_p=inputs.top_p)


def unfolded_mrv2(inputs: Mrv2Inputs) -> Mrv2Inputs:
    """``inputs`` with the processed logits of :func:`process_mrv2` and no parameters."""
    return replace(inputs, target_logits=process_mrv2(inputs), apply_sampling_params=False,
                   min_p=None, top_k=None, top_p=None)
