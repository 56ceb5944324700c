"""Gumbel-max sampling with Model Runner V2's semantics and random numbers, tuned.

Semantics and arguments are those of vLLM's MRV2 ``gumbel_sample``
(``vllm/v1/worker/gpu/sample/gumbel.py``, 0.32 and 0.33): for each token row, the argmax
of the logits (float32; divided by the request's temperature when ``apply_temperature``)
plus Gumbel noise; a temperature of 0, or a padded row (request state ``-1``), takes the
plain argmax. The noise is vLLM's, bit for bit: a MurmurHash3 of ``(seed, pos, token)`` (a
drafter's own draws at ``pos + 2**30``), see :mod:`spectune.kernels._counter_rng`. With a
``logits_cache`` the rows' logits (before temperature) are also copied into it, at the
request's state and column, as vLLM's drafters keep them for verification; from vLLM 0.33
on, the column is also mixed into the seed's high word (``seed ^ (col << 32)``, vLLM's
``spec_step_seed``), so each draft step draws from its own stream.

Two launches: one program per row and split takes the argmax of its chunk; one program
per row reduces the chunks. Every value is computed per token, so the tokens are the
same for every config (and vLLM's: the lowest index wins every tie, as there).

This module, with :mod:`spectune.kernels._counter_rng` and
:mod:`spectune.kernels._reductions`, makes the family's source hash.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from spectune.kernels._counter_rng import DRAFT_NOISE_SALT, gumbel_noise
from spectune.kernels._launch import launch_config
from spectune.kernels._reductions import argmax_of_parts, split_row
from spectune.kernels._tensors import INDEX_DTYPES, LOGITS_DTYPES, require_tensor
from spectune.kernels._vllm_version import resolve_vllm_version
from spectune.kernels.sampling.gumbel_sample_space import default_config, problem_for, search_space

__all__ = ["gumbel_sample"]

# The reduction touches SPLITS scalars per row: one warp is plenty, on any GPU.
_REDUCE_NUM_WARPS = 1


@triton.jit
def _chunk_kernel(
    x_ptr, x_stride, idx_map_ptr, temp_ptr, seed_ptr, pos_ptr,
    cache_ptr, cache_stride0, cache_stride1, col_ptr, src_ptr, src_stride,
    part_max_ptr, part_arg_ptr, vocab, n_tiles, chunk,
    SPLITS: tl.constexpr, BLOCK_V: tl.constexpr, APPLY_TEMPERATURE: tl.constexpr,
    IS_DRAFTING: tl.constexpr, USE_FP64: tl.constexpr, HAS_CACHE: tl.constexpr,
    PER_TOKEN_COL: tl.constexpr, COL_SEED: tl.constexpr,
):
    """Argmax of (logits [/ temperature] + noise) over one chunk of one row."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // SPLITS
    split = pid % SPLITS
    state = tl.load(idx_map_ptr + row).to(tl.int64)
    valid = state >= 0
    # A padded row (state -1) is sampled greedily with seed 0, as vLLM does.
    safe_state = tl.where(valid, state, 0)
    temp = tl.where(valid, tl.load(temp_ptr + safe_state).to(tl.float32), 0.0)
    seed = tl.where(valid, tl.load(seed_ptr + safe_state), 0)
    pos = tl.load(pos_ptr + row)
    if IS_DRAFTING:
        pos = pos + DRAFT_NOISE_SALT
    if HAS_CACHE:
        if PER_TOKEN_COL:
            col = tl.load(col_ptr + row).to(tl.int64)
        else:
            col = tl.load(col_ptr).to(tl.int64)
        if COL_SEED:
            # vLLM 0.33: each cache column (draft step) draws from its own stream.
            seed = seed ^ (col << 32)
    offs = tl.arange(0, BLOCK_V)
    lo = split * chunk
    best = tl.full((), float("-inf"), tl.float64 if USE_FP64 else tl.float32)
    best_idx = lo.to(tl.int32)
    for t in range(n_tiles):
        idx = lo + t * BLOCK_V + offs
        in_vocab = idx < vocab
        if HAS_CACHE:
            # The logits before temperature, in the cache's dtype (vLLM's drafters keep
            # them for verification, which divides by the same temperature).
            kept = tl.load(src_ptr + row * src_stride + idx, mask=in_vocab)
            # (A vector mask: Triton's interpreter refuses a scalar one broadcast here.)
            tl.store(cache_ptr + state * cache_stride0 + col * cache_stride1 + idx, kept,
                     mask=in_vocab & (idx - idx + state >= 0))
        x = tl.load(x_ptr + row * x_stride + idx, mask=in_vocab, other=float("-inf"))
        x = x.to(tl.float32)
        if temp != 0.0 and APPLY_TEMPERATURE:
            x = x / temp
        if USE_FP64:
            x = x.to(tl.float64)
        if temp != 0.0:
            x = tl.where(in_vocab, x + gumbel_noise(seed, pos, idx, USE_FP64), float("-inf"))
        tile_best, tile_arg = tl.max(x, axis=0, return_indices=True)
        # Strictly greater: an earlier tile keeps a tie (lowest index).
        if tile_best > best:
            best = tile_best
            best_idx = (lo + t * BLOCK_V + tile_arg).to(tl.int32)
    tl.store(part_max_ptr + pid, best)
    tl.store(part_arg_ptr + pid, best_idx)


@triton.jit
def _reduce_kernel(out_ptr, part_max_ptr, part_arg_ptr, SPLITS: tl.constexpr,
                   BLOCK_S: tl.constexpr):
    """One program per row: the winning chunk's token (the lowest chunk on ties)."""
    row = tl.program_id(0).to(tl.int64)
    token = argmax_of_parts(part_max_ptr, part_arg_ptr, row, SPLITS, BLOCK_S)
    tl.store(out_ptr + row, token.to(tl.int64))


def gumbel_sample(
    logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    pos: torch.Tensor,
    apply_temperature: bool,
    is_drafting: bool,
    logits_cache: torch.Tensor | None = None,
    logits_cache_col: torch.Tensor | None = None,
    use_fp64: bool = False,
    logits_cache_source: torch.Tensor | None = None,
    *,
    vllm_version: str | None = None,
    config: Mapping[str, int] | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Sample one token per row by Gumbel-max; vLLM Model Runner V2 semantics.

    Args:
        logits: ``[num_tokens, V]`` float32/bfloat16/float16 (last dim contiguous).
        expanded_idx_mapping: ``[num_tokens]`` request state of each row (``-1``: padded,
            sampled greedily).
        temperature: ``[max_num_reqs]`` float32; 0 means greedy.
        seed: ``[max_num_reqs]`` int64 per-request seeds.
        pos: ``[num_tokens]`` position of each row (the noise's counter).
        apply_temperature: Divide the logits by the temperature first.
        is_drafting: A drafter's own draws (noise at ``pos + 2**30``).
        logits_cache: ``[max_num_reqs, num_cols, V']`` (``V' >= V``) where the rows'
            logits before temperature are also stored, or ``None``.
        logits_cache_col: The cache column: a scalar tensor, or ``[num_tokens]`` per row.
        use_fp64: Gumbel-max in float64 (vLLM's ``use_fp64_gumbel``).
        logits_cache_source: What is stored in the cache (default ``logits``); same shape
            as ``logits``, the cache's dtype.
        vllm_version: Whose semantics: ``"0.32"`` or ``"0.33"`` (with a cache, 0.33
            mixes the row's column into its seed); ``None``, the installed vLLM's
            (:func:`spectune.kernels.vllm_semantics_version`).
        config: Launch configuration (see
            :func:`~spectune.kernels.sampling.gumbel_sample_space.search_space`); ``None`` uses
            the default config of the launch's problem.
        validate: Also check what needs the tensors' contents (request states, cache
            columns); callers that guarantee them pass ``False``: no device sync then.

    Returns:
        ``[num_tokens]`` int64 sampled token ids.

    Raises:
        ValueError: naming the offending argument, before any launch.
    """
    source = _check_inputs(
        logits, expanded_idx_mapping, temperature, seed, pos, logits_cache, logits_cache_col,
        logits_cache_source, apply_temperature=apply_temperature, is_drafting=is_drafting,
        use_fp64=use_fp64, validate=validate,
    )
    col_seed = resolve_vllm_version(vllm_version) != "0.32" and logits_cache is not None
    num_tokens, vocab = logits.shape
    config, launch_opts = launch_config(
        config, logits.device, search_space=search_space, default_config=default_config,
        problem=lambda: problem_for(num_tokens=num_tokens, vocab=vocab, dtype=logits.dtype),
    )
    out = torch.empty(num_tokens, dtype=torch.int64, device=logits.device)
    if num_tokens == 0:
        return out
    block, per_split, splits, chunk = split_row(vocab, config["BLOCK_V"], config["SPLITS"])
    score_dtype = torch.float64 if use_fp64 else torch.float32
    part_max = torch.empty(num_tokens * splits, dtype=score_dtype, device=logits.device)
    part_arg = torch.empty(num_tokens * splits, dtype=torch.int32, device=logits.device)
    has_cache = logits_cache is not None
    if has_cache:
        assert logits_cache is not None and logits_cache_col is not None and source is not None
        cache, col, src = logits_cache, logits_cache_col, source
        cache_strides = (logits_cache.stride(0), logits_cache.stride(1))
        src_stride = source.stride(0)
    else:
        # Never read (HAS_CACHE is a constexpr); any pointer stands in.
        cache, col, src, cache_strides, src_stride = logits, pos, logits, (0, 0), 0
    _chunk_kernel[(num_tokens * splits,)](
        logits, logits.stride(0), expanded_idx_mapping, temperature, seed, pos,
        cache, *cache_strides, col, src, src_stride,
        part_max, part_arg, vocab, per_split, chunk,
        SPLITS=splits, BLOCK_V=block, APPLY_TEMPERATURE=apply_temperature,
        IS_DRAFTING=is_drafting, USE_FP64=use_fp64, HAS_CACHE=has_cache,
        PER_TOKEN_COL=has_cache and col.dim() > 0, COL_SEED=col_seed, **launch_opts,
    )
    _reduce_kernel[(num_tokens,)](
        out, part_max, part_arg, SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits),
        num_warps=_REDUCE_NUM_WARPS,
    )
    return out


def _check_inputs(
    logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    pos: torch.Tensor,
    logits_cache: torch.Tensor | None,
    logits_cache_col: torch.Tensor | None,
    logits_cache_source: torch.Tensor | None,
    *,
    apply_temperature: bool,
    is_drafting: bool,
    use_fp64: bool,
    validate: bool,
) -> torch.Tensor | None:
    """Check the arguments (shapes, dtypes; contents when ``validate``); returns the
    cache's source rows (``None`` without a cache)."""
    require_tensor("logits", logits, ndim=2, dtypes=LOGITS_DTYPES, rows=True)
    num_tokens, vocab = logits.shape
    on = ("logits", logits.device)
    if vocab < 1:
        raise ValueError("logits: vocab size (dim 1) must be at least 1")
    for name, flag in (("apply_temperature", apply_temperature), ("is_drafting", is_drafting),
                       ("use_fp64", use_fp64)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be a bool, got {flag!r}")
    require_tensor("expanded_idx_mapping", expanded_idx_mapping, ndim=1, dtypes=INDEX_DTYPES,
                   same_device_as=on, shape=(num_tokens,))
    require_tensor("pos", pos, ndim=1, dtypes=INDEX_DTYPES, same_device_as=on,
                   shape=(num_tokens,))
    require_tensor("temperature", temperature, ndim=1, dtypes=(torch.float32,),
                   same_device_as=on)
    require_tensor("seed", seed, ndim=1, dtypes=(torch.int64,), same_device_as=on,
                   shape=tuple(temperature.shape))
    source = None
    if logits_cache is None:
        if logits_cache_source is not None:
            raise ValueError("logits_cache_source requires logits_cache")
        if logits_cache_col is not None:
            raise ValueError("logits_cache_col requires logits_cache")
    else:
        require_tensor("logits_cache", logits_cache, ndim=3, dtypes=LOGITS_DTYPES,
                       same_device_as=on, rows=True)
        if logits_cache.shape[-1] < vocab:
            raise ValueError(
                f"logits_cache: its vocab dim ({logits_cache.shape[-1]}) is narrower than "
                f"the logits' ({vocab})"
            )
        if logits_cache_col is None:
            raise ValueError("logits_cache_col is required with logits_cache")
        require_tensor("logits_cache_col", logits_cache_col, dtypes=INDEX_DTYPES,
                       same_device_as=on)
        if logits_cache_col.dim() > 1 or (
            logits_cache_col.dim() == 1 and logits_cache_col.shape[0] != num_tokens
        ):
            raise ValueError(
                f"logits_cache_col must be a scalar or have shape [{num_tokens}], got "
                f"{list(logits_cache_col.shape)}"
            )
        source = logits if logits_cache_source is None else logits_cache_source
        require_tensor("logits_cache_source", source, ndim=2, dtypes=(logits_cache.dtype,),
                       same_device_as=on, shape=(num_tokens, vocab), rows=True)
    if validate and num_tokens > 0:
        states = expanded_idx_mapping.to(torch.int64).cpu()
        if bool((states < -1).any()) or bool((states >= temperature.shape[0]).any()):
            raise ValueError(
                f"expanded_idx_mapping must index temperature and seed (-1 <= state < "
                f"{temperature.shape[0]})"
            )
        if logits_cache is not None:
            assert logits_cache_col is not None
            if bool((states >= logits_cache.shape[0]).any()):
                raise ValueError(
                    f"expanded_idx_mapping must index logits_cache (dim 0 is "
                    f"{logits_cache.shape[0]})"
                )
            cols = logits_cache_col.to(torch.int64).cpu()
            if bool((cols < 0).any()) or bool((cols >= logits_cache.shape[1]).any()):
                raise ValueError(
                    f"logits_cache_col must be in [0, {logits_cache.shape[1]})"
                )
        temps = temperature.cpu()
        if not bool(torch.isfinite(temps).all()) or bool((temps < 0).any()):
            raise ValueError("temperature must be finite and non-negative")
    return source
