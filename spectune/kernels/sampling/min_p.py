"""Min-p filtering with Model Runner V2's semantics, tuned.

Semantics and arguments are those of vLLM 0.32's MRV2 ``apply_min_p``
(``vllm/v1/worker/gpu/sample/min_p.py``): in place, in each row whose request has a
nonzero ``min_p``, every logit below ``threshold = row max + log(min_p)`` becomes
``-inf``; the row max is taken in float32 and the threshold is computed, as there, by
``tl.log`` on float32 (the others are kept, and the row rewritten). A row with
``min_p == 0`` is left untouched, as there; a padded row (request state ``-1``) is left
untouched too: vLLM's kernel would read ``min_p[-1]``, outside the tensor; here it reads
nothing and writes nothing.

``SPLITS`` 1 is vLLM's launch: one program per row takes the row max, then masks the row.
With more splits, one program per (row, split) takes the max of its chunk into a
partials buffer; then one program per (row, split) takes the row max from the partials
and masks its chunk. A max is exact in any order, so the threshold, and every logit, is
bit-identical to vLLM's for every config.

This module, with :mod:`spectune.kernels._reductions` (``split_row``), makes the family's
source hash.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from spectune.kernels._launch import launch_config
from spectune.kernels._reductions import split_row
from spectune.kernels._tensors import check_state_rows
from spectune.kernels.sampling.min_p_space import default_config, problem_for, search_space

__all__ = ["apply_min_p"]


@triton.jit
def _row_min_p(idx_map_ptr, min_p_ptr, row):
    """The row's ``min_p`` as float32; 0 (skipped) for a padded row, which reads none."""
    state = tl.load(idx_map_ptr + row).to(tl.int64)
    return tl.load(min_p_ptr + state, mask=state >= 0, other=0.0).to(tl.float32)


@triton.jit
def _chunk_max(x_ptr, lo, vocab, n_tiles, BLOCK_V: tl.constexpr):
    """float32 max of x[lo : lo + n_tiles * BLOCK_V] (clipped to vocab); -inf if empty."""
    offs = tl.arange(0, BLOCK_V)
    acc = tl.full((BLOCK_V,), float("-inf"), tl.float32)
    for t in range(n_tiles):
        idx = lo + t * BLOCK_V + offs
        x = tl.load(x_ptr + idx, mask=idx < vocab, other=float("-inf"))
        acc = tl.maximum(acc, x.to(tl.float32))
    return tl.max(acc, axis=0)


@triton.jit
def _mask_chunk(x_ptr, out_ptr, lo, vocab, n_tiles, threshold, BLOCK_V: tl.constexpr):
    """out[i] = -inf where x[i] < threshold, else x[i], over one chunk (in x's dtype)."""
    offs = tl.arange(0, BLOCK_V)
    for t in range(n_tiles):
        idx = lo + t * BLOCK_V + offs
        in_vocab = idx < vocab
        x = tl.load(x_ptr + idx, mask=in_vocab, other=float("-inf"))
        x = tl.where(x < threshold, float("-inf"), x)
        tl.store(out_ptr + idx, x, mask=in_vocab)


@triton.jit
def _min_p_row_kernel(
    x_ptr, x_stride, out_ptr, out_stride, idx_map_ptr, min_p_ptr, vocab, n_tiles,
    BLOCK_V: tl.constexpr,
):
    """SPLITS 1: one program per row takes the row max, then masks the row."""
    row = tl.program_id(0).to(tl.int64)
    min_p = _row_min_p(idx_map_ptr, min_p_ptr, row)
    if min_p == 0.0:
        return
    row_max = _chunk_max(x_ptr + row * x_stride, 0, vocab, n_tiles, BLOCK_V)
    threshold = row_max + tl.log(min_p)
    _mask_chunk(x_ptr + row * x_stride, out_ptr + row * out_stride, 0, vocab, n_tiles,
                threshold, BLOCK_V)


@triton.jit
def _chunk_max_kernel(
    x_ptr, x_stride, idx_map_ptr, min_p_ptr, part_ptr, vocab, n_tiles, chunk,
    SPLITS: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """One program per (row, split): the max of its chunk into the partials."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // SPLITS
    min_p = _row_min_p(idx_map_ptr, min_p_ptr, row)
    if min_p == 0.0:
        return  # the row's partials are never read
    lo = (pid % SPLITS) * chunk
    tl.store(part_ptr + pid, _chunk_max(x_ptr + row * x_stride, lo, vocab, n_tiles, BLOCK_V))


@triton.jit
def _mask_kernel(
    x_ptr, x_stride, out_ptr, out_stride, idx_map_ptr, min_p_ptr, part_ptr, vocab, n_tiles,
    chunk, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """One program per (row, split): the row max from the partials, then its chunk masked."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // SPLITS
    min_p = _row_min_p(idx_map_ptr, min_p_ptr, row)
    if min_p == 0.0:
        return
    offs = tl.arange(0, BLOCK_S)
    parts = tl.load(part_ptr + row * SPLITS + offs, mask=offs < SPLITS, other=float("-inf"))
    threshold = tl.max(parts, axis=0) + tl.log(min_p)
    lo = (pid % SPLITS) * chunk
    _mask_chunk(x_ptr + row * x_stride, out_ptr + row * out_stride, lo, vocab, n_tiles,
                threshold, BLOCK_V)


def apply_min_p(
    logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    min_p: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: Mapping[str, int] | None = None,
    validate: bool = True,
) -> None:
    """Mask each row's logits below ``row max + log(min_p)`` to ``-inf``, in place; vLLM
    0.32 MRV2 semantics.

    Args:
        logits: ``[num_tokens, V]`` float32/bfloat16/float16 (last dim contiguous),
            changed in place.
        expanded_idx_mapping: ``[num_tokens]`` request state of each row (``-1``: a padded
            row, left untouched).
        min_p: ``[max_num_reqs]`` float32 per request state, in ``[0, 1]``; rows at 0 are
            left untouched.
        out: Where the filtered rows are written instead of ``logits`` (same shape and
            dtype, on the same device), which are then only read. Rows the kernels skip
            are not written, so ``out`` should start as a copy of ``logits``. The tuner
            times the in-place kernels this way on unchanging inputs.
        config: Launch configuration (see
            :func:`~spectune.kernels.sampling.min_p_space.search_space`); ``None`` uses the
            default config of the launch's problem.
        validate: Also check what needs the tensors' contents (request states, ``min_p``
            values); callers that guarantee them pass ``False``: no device sync then.

    Raises:
        ValueError: naming the offending argument, before any launch.
    """
    target = check_state_rows(
        logits, expanded_idx_mapping, min_p, out, name="min_p",
        values_ok=lambda v: (v >= 0) & (v <= 1), rule="in [0, 1] (and not NaN)",
        validate=validate,
    )
    num_tokens, vocab = logits.shape
    config, launch_opts = launch_config(
        config, logits.device, search_space=search_space, default_config=default_config,
        problem=lambda: problem_for(num_tokens=num_tokens, vocab=vocab, dtype=logits.dtype),
    )
    if num_tokens == 0:
        return
    block, per_split, splits, chunk = split_row(vocab, config["BLOCK_V"], config["SPLITS"])
    if splits == 1:
        _min_p_row_kernel[(num_tokens,)](
            logits, logits.stride(0), target, target.stride(0), expanded_idx_mapping, min_p,
            vocab, per_split, BLOCK_V=block, **launch_opts,
        )
        return
    parts = torch.empty(num_tokens * splits, dtype=torch.float32, device=logits.device)
    _chunk_max_kernel[(num_tokens * splits,)](
        logits, logits.stride(0), expanded_idx_mapping, min_p, parts, vocab, per_split, chunk,
        SPLITS=splits, BLOCK_V=block, **launch_opts,
    )
    _mask_kernel[(num_tokens * splits,)](
        logits, logits.stride(0), target, target.stride(0), expanded_idx_mapping, min_p,
        parts, vocab, per_split, chunk, SPLITS=splits,
        BLOCK_S=triton.next_power_of_2(splits), BLOCK_V=block, **launch_opts,
    )

