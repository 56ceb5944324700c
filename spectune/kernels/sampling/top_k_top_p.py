"""Top-k / top-p masking with vLLM 0.32's semantics, exact and tuned.

Semantics are those of vLLM's sort-based definition (``apply_top_k_top_p_pytorch`` in
``vllm/v1/sample/ops/topk_topp_sampler.py``), which its Triton kernel approximates:
top-k keeps every logit ``>=`` the row's k-th largest (ties included); top-p, on what
top-k kept, keeps the smallest set of largest logits whose probability reaches ``p``
(the largest always). Every other logit becomes ``-inf``, in place. Where equal logits
straddle the top-p boundary the definition's own unstable sort decides which of them
stay; here all of them stay (the reference flags such rows).

One program per row finds the row's threshold without sorting (see
:mod:`spectune.kernels._truncation`: a pivot search on exact integer counts and
fixed-point masses, the same under every config), then writes ``-inf`` below it.

This module, with :mod:`spectune.kernels._truncation` and
:mod:`spectune.kernels.rejection.rejection_sample_constants`, makes the family's source hash.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from spectune.kernels._launch import launch_config
from spectune.kernels._tensors import INDEX_DTYPES, LOGITS_DTYPES, require_tensor
from spectune.kernels._truncation import keep_threshold, order_key, row_stats
from spectune.kernels.rejection.rejection_sample_constants import MAX_VOCAB
from spectune.kernels.sampling.top_k_top_p_space import default_config, problem_for, search_space

__all__ = ["top_k_top_p"]


@triton.jit
def _mask_kernel(
    x_ptr, x_stride, k_ptr, p_ptr, vocab, n_tiles,
    HAS_K: tl.constexpr, HAS_P: tl.constexpr, BLOCK_V: tl.constexpr, PIVOTS: tl.constexpr,
):
    """One row: find the kept threshold, then write ``-inf`` under it."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    k = tl.zeros((), tl.int64)
    p = tl.full((), 1.0, tl.float32)
    if HAS_K:
        k = tl.load(k_ptr + row).to(tl.int64)
    if HAS_P:
        p = tl.load(p_ptr + row).to(tl.float32)
    active = (HAS_K & (k >= 1) & (k < vocab)) | (HAS_P & (p < 1.0))
    if active:
        row_max, row_min = row_stats(x_row, vocab, n_tiles, 1.0, float("-inf"), False, BLOCK_V)
        threshold = keep_threshold(
            x_row, vocab, n_tiles, 1.0, float("-inf"), row_max, row_min, k, p,
            False, HAS_K, HAS_P, BLOCK_V, PIVOTS,
        )
        if threshold > order_key(row_min):
            offs = tl.arange(0, BLOCK_V)
            for t in range(n_tiles):
                idx = t * BLOCK_V + offs
                in_vocab = idx < vocab
                x = tl.load(x_row + idx, mask=in_vocab, other=float("-inf")).to(tl.float32)
                drop = in_vocab & (order_key(x) < threshold)
                tl.store(x_row + idx, tl.full((BLOCK_V,), float("-inf"), tl.float32),
                         mask=drop)


def top_k_top_p(
    logits: torch.Tensor,
    k: torch.Tensor | None,
    p: torch.Tensor | None,
    *,
    config: Mapping[str, int] | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Mask each row's logits outside its top-k, then top-p, set; vLLM 0.32 semantics.

    Args:
        logits: ``[num_tokens, V]`` float32/bfloat16/float16 (last dim contiguous);
            masked in place.
        k: ``[num_tokens]`` int32/int64 top-k per row, or ``None``. A row's ``k`` of at
            least ``V`` (or below 1) keeps the whole row, as vLLM's "no top-k".
        p: ``[num_tokens]`` float32 top-p per row in ``(0, 1]``, or ``None``; 1 keeps
            the row.
        config: Launch configuration (see
            :func:`~spectune.kernels.sampling.top_k_top_p_space.search_space`); ``None`` uses the
            default config of the launch's problem.
        validate: Also check what needs the tensors' contents (``p`` in ``(0, 1]``);
            callers that guarantee it pass ``False``: no device sync then.

    Returns:
        ``logits``, masked.

    Raises:
        ValueError: naming the offending argument, before any launch.
    """
    _check_inputs(logits, k, p, validate=validate)
    num_tokens, vocab = logits.shape
    if num_tokens == 0 or (k is None and p is None):
        return logits
    config, launch_opts = launch_config(
        config, logits.device, search_space=search_space, default_config=default_config,
        problem=lambda: problem_for(num_tokens=num_tokens, vocab=vocab, dtype=logits.dtype),
    )
    block = min(config["BLOCK_V"], triton.next_power_of_2(vocab))
    _mask_kernel[(num_tokens,)](
        logits, logits.stride(0), logits if k is None else k, logits if p is None else p,
        vocab, triton.cdiv(vocab, block),
        HAS_K=k is not None, HAS_P=p is not None, BLOCK_V=block, PIVOTS=config["PIVOTS"],
        **launch_opts,
    )
    return logits


def _check_inputs(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None, *, validate: bool
) -> None:
    require_tensor("logits", logits, ndim=2, dtypes=LOGITS_DTYPES, rows=True)
    num_tokens, vocab = logits.shape
    if vocab < 1:
        raise ValueError("logits: vocab size (dim 1) must be at least 1")
    if vocab > MAX_VOCAB:
        raise ValueError(f"logits: vocab size {vocab} exceeds the supported {MAX_VOCAB}")
    on = ("logits", logits.device)
    if k is not None:
        require_tensor("k", k, ndim=1, dtypes=INDEX_DTYPES, same_device_as=on,
                       shape=(num_tokens,))
    if p is not None:
        require_tensor("p", p, ndim=1, dtypes=(torch.float32,), same_device_as=on,
                       shape=(num_tokens,))
        if validate and num_tokens > 0:
            values = p.cpu()
            if not bool(((values > 0) & (values <= 1)).all()):
                raise ValueError("p must be in (0, 1] (top-p of every row)")
