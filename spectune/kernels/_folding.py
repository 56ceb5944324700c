"""Sampling parameters folded into verification: each target logit processed as it loads.

vLLM applies a request's temperature, min-p, top-k and top-p to the target logits before
verifying drafts against them, writing the processed ``[N, V]`` rows (an fp32 copy in
Model Runner V2, in place in V1) and reading them back. Folded, the verification kernels
read the raw logits and process every value they load (:func:`fold`) from three numbers
per row that one small pre-pass finds (:func:`fold_rows`): the temperature, min-p's
threshold and the top-k/top-p key threshold of :mod:`spectune.kernels._truncation`.
The processed values are the very floats the unfolded chain writes (the same float32
division, the same ``max + log(min_p)``, the same exact threshold search), so the
verification sees the same row and gives the same tokens.

Rows whose request is greedy (temperature 0) are not processed: every step keeps their
argmax, the only thing verification reads of them.

Part of the source hash of every family that folds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from spectune.kernels._truncation import divide, order_key, processed_threshold

__all__ = ["FoldedRows", "fold", "fold_rows", "load_folded", "row_fold"]


@triton.jit
def fold(x, temp, min_value, threshold, DIV: tl.constexpr):
    """float32 logits ``x`` as the sampler leaves them: divided by ``temp`` (as ``DIV``
    says: :func:`~spectune.kernels._truncation.divide`), ``-inf`` below ``min_value``
    (min-p), ``-inf`` where their key is under ``threshold`` (top-k/top-p)."""
    x = divide(x, temp, DIV)
    x = tl.where(x < min_value, float("-inf"), x)
    return tl.where(order_key(x) < threshold, float("-inf"), x)


@triton.jit
def row_fold(fold_temp_ptr, fold_min_ptr, fold_key_ptr, row, FOLD: tl.constexpr):
    """Row ``row``'s fold parameters (:func:`fold_rows`' outputs) when ``FOLD``, else the
    values that leave a logit as it is: ``(temp, min_value, threshold)``."""
    temp = tl.full((), 1.0, tl.float32)
    min_value = tl.full((), float("-inf"), tl.float32)
    threshold = order_key(min_value)
    if FOLD:
        temp = tl.load(fold_temp_ptr + row)
        min_value = tl.load(fold_min_ptr + row)
        threshold = tl.load(fold_key_ptr + row)
    return temp, min_value, threshold


@triton.jit
def load_folded(ptr, mask, temp, min_value, threshold, FOLD: tl.constexpr):
    """Load logits as float32 (``-inf`` where masked off), folded when ``FOLD`` (0: not
    folded; else the division's mode, see :func:`fold`)."""
    x = tl.load(ptr, mask=mask, other=float("-inf")).to(tl.float32)
    if FOLD:
        x = fold(x, temp, min_value, threshold, FOLD)
    return x


@triton.jit
def _fold_rows_kernel(
    x_ptr, x_stride, sel_ptr, temp_ptr, min_p_ptr, k_ptr, p_ptr,
    out_temp_ptr, out_min_ptr, out_key_ptr, vocab, n_tiles,
    DIV: tl.constexpr, HAS_MIN_P: tl.constexpr, HAS_K: tl.constexpr, HAS_P: tl.constexpr,
    BLOCK_V: tl.constexpr, PIVOTS: tl.constexpr,
):
    """One row: its request's parameters, and the min-p and top-k/top-p thresholds."""
    row = tl.program_id(0).to(tl.int64)
    sel = tl.load(sel_ptr + row).to(tl.int64)
    safe = tl.where(sel >= 0, sel, 0)
    temp = tl.where(sel >= 0, tl.load(temp_ptr + safe).to(tl.float32), 0.0)
    min_p = tl.zeros((), tl.float32)
    k = tl.zeros((), tl.int64)
    p = tl.full((), 1.0, tl.float32)
    if HAS_MIN_P:
        min_p = tl.load(min_p_ptr + safe).to(tl.float32)
    if HAS_K:
        k = tl.load(k_ptr + safe).to(tl.int64)
    if HAS_P:
        p = tl.load(p_ptr + safe).to(tl.float32)
    min_value = tl.full((), float("-inf"), tl.float32)
    threshold = order_key(min_value)
    truncates = (min_p != 0.0) | (HAS_K & (k >= 1) & (k < vocab)) | (HAS_P & (p < 1.0))
    if (temp != 0.0) & truncates:
        min_value, threshold = processed_threshold(
            x_ptr + row * x_stride, vocab, n_tiles, temp, min_p, k, p, DIV, HAS_K, HAS_P,
            BLOCK_V, PIVOTS,
        )
    # Greedy rows are never folded; 1 leaves any value that reads it unchanged.
    tl.store(out_temp_ptr + row, tl.where(temp == 0.0, 1.0, temp))
    tl.store(out_min_ptr + row, min_value)
    tl.store(out_key_ptr + row, threshold)


@dataclass
class FoldedRows:
    """What :func:`fold` needs of each row: ``[N]`` temperature (float32), min-p
    threshold (float32, ``-inf`` for none) and top-k/top-p key threshold (int64)."""

    temp: torch.Tensor
    min_value: torch.Tensor
    threshold: torch.Tensor


def fold_rows(
    logits: torch.Tensor,
    row_params: torch.Tensor,
    temperature: torch.Tensor,
    *,
    min_p: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    div: int,
    config: Mapping[str, int],
    launch_opts: Mapping[str, Any],
) -> FoldedRows:
    """Launch the pre-pass: one program per row of ``logits``.

    Args:
        logits: ``[N, V]`` raw target logits (rows may be strided).
        row_params: ``[N]`` index of each row's parameters (``-1``: none, not folded).
        temperature: Per-parameter-index float32; 0 (greedy) means not folded.
        min_p, top_k, top_p: Per-parameter-index tensors, or ``None`` for none.
        div: How the temperature divides: :data:`~spectune.kernels._truncation.TRITON_DIV`
            (as vLLM's Triton sampling kernels) or
            :data:`~spectune.kernels._truncation.ROUNDED_DIV` (as PyTorch).
        config: ``BLOCK_T`` (tile) and ``PIVOTS`` (candidates per pass) of the search.
        launch_opts: Warps, stages and backend options, as the verification's.
    """
    rows, vocab = logits.shape
    device = logits.device
    out = FoldedRows(
        temp=torch.empty(rows, dtype=torch.float32, device=device),
        min_value=torch.empty(rows, dtype=torch.float32, device=device),
        threshold=torch.empty(rows, dtype=torch.int64, device=device),
    )
    if rows == 0:
        return out
    block = min(config["BLOCK_T"], triton.next_power_of_2(vocab))
    # Absent parameters are never read (constexpr flags); any pointer stands in.
    _fold_rows_kernel[(rows,)](
        logits, logits.stride(0), row_params, temperature,
        temperature if min_p is None else min_p,
        temperature if top_k is None else top_k,
        temperature if top_p is None else top_p,
        out.temp, out.min_value, out.threshold, vocab, triton.cdiv(vocab, block),
        DIV=div, HAS_MIN_P=min_p is not None, HAS_K=top_k is not None, HAS_P=top_p is not None,
        BLOCK_V=block, PIVOTS=config["PIVOTS"], **launch_opts,
    )
    return out
