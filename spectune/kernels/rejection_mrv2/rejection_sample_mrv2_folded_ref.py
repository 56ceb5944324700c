"""What folded Model Runner V2 verification must equal: the sampling parameters applied
first, then the unfolded verification.

:func:`process_mrv2` writes the processed ``[N, V]`` float32 rows that Model Runner V2's
``Sampler.apply_sampling_params`` writes: temperature (spectune's ``apply_temperature``,
bit-identical to vLLM's), then min-p and top-k/top-p as V1's folded reference
(:func:`~spectune.kernels.rejection.rejection_sample_folded_ref.truncate`). The
folded family's reference verifies those rows with the unfolded family's PyTorch
reference.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from spectune.kernels.rejection.rejection_sample_folded_ref import truncate
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_inputs import Mrv2Inputs

__all__ = ["process_mrv2", "unfolded_mrv2"]


def process_mrv2(inputs: Mrv2Inputs) -> torch.Tensor:
    """The target logits as Model Runner V2's ``apply_sampling_params`` leaves them (no
    logits processors): a float32 copy, tempered, then min-p and top-k/top-p."""
    # Imported here, as in truncate: serving loads this module and never calls it.
    from spectune.kernels.sampling.temperature import apply_temperature

    logits = inputs.target_logits.to(torch.float32).clone()
    if not inputs.apply_sampling_params:
        return logits
    rows = inputs.expanded_idx_mapping
    apply_temperature(logits, rows, inputs.temperature)
    return truncate(logits, rows, min_p=inputs.min_p, top_k=inputs.top_k, top_p=inputs.top_p)


def unfolded_mrv2(inputs: Mrv2Inputs) -> Mrv2Inputs:
    """``inputs`` with the processed logits of :func:`process_mrv2` and no parameters."""
    return replace(inputs, target_logits=process_mrv2(inputs), apply_sampling_params=False,
                   min_p=None, top_k=None, top_p=None)
