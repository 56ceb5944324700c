"""Top-k / top-p masking as each supported vLLM release's seam calls it.

:func:`top_k_top_p` is the public launcher (:func:`spectune.kernels.top_k_top_p`): the
arguments of vLLM's ``apply_top_k_top_p`` in 0.32 (``logits, k, p``) and 0.33 (and
``has_topp_only_rows``), and ``vllm_version=`` ("0.32" or "0.33"; ``None``: the
installed vLLM's, else the newest supported). Both releases' semantics are one: vLLM's
sort-based definition, ``apply_top_k_top_p_pytorch``, whose source 0.33 did not change;
the masking is :func:`spectune.kernels.sampling.top_k_top_p.top_k_top_p`'s, untouched
(its kernels, its launch, its source hash).

What 0.33 changed is inside vLLM's Triton kernel, which approximates that definition
with a float pivot search (tests/kernels/sampling/test_top_k_top_p.py counts where it
and the definition part): its split top-p pipeline (CUDA and ROCm, small batches, rows
with top-p only) now masks in probability space and splits by the vocabulary as well,
and its single-kernel path skips the top-k search when a row has at most ``k`` finite
logits (a row it never masked by top-k before either). ``has_topp_only_rows`` is a
promise about the rows (False: no row has ``p < 1`` with ``k >= V``) that lets vLLM skip
that pipeline; the definition, hence the mask, does not depend on it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels._vllm_version import resolve_vllm_version
from spectune.kernels.sampling.top_k_top_p import top_k_top_p as _top_k_top_p

__all__ = ["top_k_top_p"]


def top_k_top_p(
    logits: torch.Tensor,
    k: torch.Tensor | None,
    p: torch.Tensor | None,
    has_topp_only_rows: bool = True,
    *,
    vllm_version: str | None = None,
    config: Mapping[str, int] | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Mask each row's logits outside its top-k, then top-p, set, in place; vLLM's
    sort-based definition (0.32's and 0.33's alike).

    Args:
        logits, k, p, config, validate: As
            :func:`spectune.kernels.sampling.top_k_top_p.top_k_top_p` takes them.
        has_topp_only_rows: vLLM 0.33's promise that some row has top-p alone (``p < 1``
            and ``k >= V``); the mask does not depend on it.
        vllm_version: "0.32" or "0.33": whose semantics (the same mask); ``None``: the
            installed vLLM's.

    Returns:
        ``logits``, masked.

    Raises:
        ValueError: naming the offending argument, before any launch.
    """
    resolve_vllm_version(vllm_version)
    if not isinstance(has_topp_only_rows, bool):
        raise ValueError(f"has_topp_only_rows must be a bool, got {has_topp_only_rows!r}")
    return _top_k_top_p(logits, k, p, config=config, validate=validate)
