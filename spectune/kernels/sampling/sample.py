"""One fused sampler: temperature, min-p, top-k, top-p and Gumbel-max in one kernel.

What Model Runner V2 of vLLM 0.32 does in four or five launches, writing an fp32 copy of
the logits and masking it in place (``Sampler.sample``: ``apply_temperature``,
``apply_min_p``, ``apply_top_k_top_p``, ``gumbel_sample(apply_temperature=False)``),
here in one program per row that never writes a logit: each pass re-reads the row and
applies the parameters on the fly (:func:`spectune.kernels._truncation.load_values`),
the top-k/top-p threshold is found by the exact search of
:mod:`spectune.kernels._truncation`, and a last pass takes the Gumbel-max over the kept
tokens with vLLM's counter-based noise (:mod:`spectune.kernels._counter_rng`).

Every value is computed with the same float32 operations as the unfused chain (the
division by the temperature, the min-p threshold ``max + log(min_p)``, the noise), so
the tokens are those of the chain given the same seeds: of spectune's unfused kernels
exactly, of vLLM's wherever its top-k/top-p keeps the definition's set.

A row whose request has temperature 0, or a padded row (state ``-1``), takes the plain
argmax of its logits (lowest index on ties), which every step of the chain keeps.

This module, with :mod:`spectune.kernels._truncation`,
:mod:`spectune.kernels._counter_rng`, :mod:`spectune.kernels._reductions` and
:mod:`spectune.kernels.rejection.rejection_sample_constants`, makes the family's source hash.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from spectune.kernels._counter_rng import gumbel_noise
from spectune.kernels._launch import launch_config
from spectune.kernels._reductions import chunk_max
from spectune.kernels._tensors import INDEX_DTYPES, LOGITS_DTYPES, require_tensor
from spectune.kernels._truncation import (
    TRITON_DIV,
    load_values,
    order_key,
    processed_threshold,
)
from spectune.kernels.rejection.rejection_sample_constants import MAX_VOCAB
from spectune.kernels.sampling.sample_space import default_config, problem_for, search_space

__all__ = ["sample"]


@triton.jit
def _sample_kernel(
    x_ptr, x_stride, idx_map_ptr, temp_ptr, min_p_ptr, top_k_ptr, top_p_ptr, seed_ptr,
    pos_ptr, out_ptr, vocab, n_tiles,
    BLOCK_V: tl.constexpr, PIVOTS: tl.constexpr, USE_FP64: tl.constexpr,
):
    """One row: parameters applied on the fly, kept threshold, Gumbel-max."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_stride
    state = tl.load(idx_map_ptr + row).to(tl.int64)
    safe = tl.where(state >= 0, state, 0)
    temp = tl.where(state >= 0, tl.load(temp_ptr + safe).to(tl.float32), 0.0)
    token = tl.zeros((), tl.int32)
    if temp == 0.0:
        _, token = chunk_max(x_row, tl.zeros((), tl.int64), vocab, n_tiles, BLOCK_V)
    else:
        min_p = tl.load(min_p_ptr + safe).to(tl.float32)
        k = tl.load(top_k_ptr + safe).to(tl.int64)
        p = tl.load(top_p_ptr + safe).to(tl.float32)
        min_value, threshold = processed_threshold(
            x_row, vocab, n_tiles, temp, min_p, k, p, TRITON_DIV, True, True, BLOCK_V, PIVOTS
        )
        seed = tl.load(seed_ptr + safe)
        pos = tl.load(pos_ptr + row)
        offs = tl.arange(0, BLOCK_V)
        best = tl.full((), float("-inf"), tl.float64 if USE_FP64 else tl.float32)
        for t in range(n_tiles):
            idx = t * BLOCK_V + offs
            in_vocab = idx < vocab
            x = load_values(x_row, idx, in_vocab, temp, min_value, TRITON_DIV)
            kept = in_vocab & (order_key(x) >= threshold)
            if USE_FP64:
                x = x.to(tl.float64)
            score = tl.where(kept, x + gumbel_noise(seed, pos, idx, USE_FP64), float("-inf"))
            tile_best, tile_arg = tl.max(score, axis=0, return_indices=True)
            # Strictly greater: an earlier tile keeps a tie (the lowest index, as vLLM).
            if tile_best > best:
                best = tile_best
                token = (t * BLOCK_V + tile_arg).to(tl.int32)
    tl.store(out_ptr + row, token.to(tl.int64))


def sample(
    logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    min_p: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    pos: torch.Tensor,
    *,
    use_fp64: bool = False,
    config: Mapping[str, int] | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Sample one token per row: temperature, min-p, top-k, top-p, then Gumbel-max.

    The parameters are per request state, as Model Runner V2 keeps them
    (``SamplingStates``); each row reads those of its state.

    Args:
        logits: ``[num_tokens, V]`` float32/bfloat16/float16 (last dim contiguous), not
            modified.
        expanded_idx_mapping: ``[num_tokens]`` request state of each row (``-1``: padded,
            sampled greedily).
        temperature: ``[max_num_reqs]`` float32; 0 means greedy.
        min_p: ``[max_num_reqs]`` float32 in ``[0, 1]``; 0 means none.
        top_k: ``[max_num_reqs]`` int32/int64; ``V`` (or more, or below 1) means none.
        top_p: ``[max_num_reqs]`` float32 in ``(0, 1]``; 1 means none.
        seed: ``[max_num_reqs]`` int64 per-request seeds.
        pos: ``[num_tokens]`` position of each row (the noise's counter).
        use_fp64: Gumbel-max in float64 (vLLM's ``use_fp64_gumbel``).
        config: Launch configuration (see
            :func:`~spectune.kernels.sampling.sample_space.search_space`); ``None`` uses the
            default config of the launch's problem.
        validate: Also check what needs the tensors' contents (request states, parameter
            ranges); callers that guarantee them pass ``False``: no device sync then.

    Returns:
        ``[num_tokens]`` int64 sampled token ids.

    Raises:
        ValueError: naming the offending argument, before any launch.
    """
    _check_inputs(logits, expanded_idx_mapping, temperature, min_p, top_k, top_p, seed, pos,
                  use_fp64=use_fp64, validate=validate)
    num_tokens, vocab = logits.shape
    out = torch.empty(num_tokens, dtype=torch.int64, device=logits.device)
    if num_tokens == 0:
        return out
    config, launch_opts = launch_config(
        config, logits.device, search_space=search_space, default_config=default_config,
        problem=lambda: problem_for(num_tokens=num_tokens, vocab=vocab, dtype=logits.dtype),
    )
    block = min(config["BLOCK_V"], triton.next_power_of_2(vocab))
    _sample_kernel[(num_tokens,)](
        logits, logits.stride(0), expanded_idx_mapping, temperature, min_p, top_k, top_p,
        seed, pos, out, vocab, triton.cdiv(vocab, block),
        BLOCK_V=block, PIVOTS=config["PIVOTS"], USE_FP64=use_fp64, **launch_opts,
    )
    return out


def _check_inputs(
    logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    min_p: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seed: torch.Tensor,
    pos: torch.Tensor,
    *,
    use_fp64: bool,
    validate: bool,
) -> None:
    require_tensor("logits", logits, ndim=2, dtypes=LOGITS_DTYPES, rows=True)
    num_tokens, vocab = logits.shape
    if vocab < 1:
        raise ValueError("logits: vocab size (dim 1) must be at least 1")
    if vocab > MAX_VOCAB:
        raise ValueError(f"logits: vocab size {vocab} exceeds the supported {MAX_VOCAB}")
    if not isinstance(use_fp64, bool):
        raise ValueError(f"use_fp64 must be a bool, got {use_fp64!r}")
    on = ("logits", logits.device)
    require_tensor("expanded_idx_mapping", expanded_idx_mapping, ndim=1, dtypes=INDEX_DTYPES,
                   same_device_as=on, shape=(num_tokens,))
    require_tensor("pos", pos, ndim=1, dtypes=INDEX_DTYPES, same_device_as=on,
                   shape=(num_tokens,))
    require_tensor("temperature", temperature, ndim=1, dtypes=(torch.float32,),
                   same_device_as=on)
    states = tuple(temperature.shape)
    for name, tensor, dtypes in (("min_p", min_p, (torch.float32,)),
                                 ("top_k", top_k, INDEX_DTYPES),
                                 ("top_p", top_p, (torch.float32,)),
                                 ("seed", seed, (torch.int64,))):
        require_tensor(name, tensor, ndim=1, dtypes=dtypes, same_device_as=on, shape=states)
    if not validate or num_tokens == 0:
        return
    mapping = expanded_idx_mapping.to(torch.int64).cpu()
    if bool((mapping < -1).any()) or bool((mapping >= states[0]).any()):
        raise ValueError(f"expanded_idx_mapping must index the request states "
                         f"(-1 <= state < {states[0]})")
    temps, mins, ps = temperature.cpu(), min_p.cpu(), top_p.cpu()
    if not bool(torch.isfinite(temps).all()) or bool((temps < 0).any()):
        raise ValueError("temperature must be finite and non-negative")
    if not bool(((mins >= 0) & (mins <= 1)).all()):
        raise ValueError("min_p must be in [0, 1]")
    if not bool(((ps > 0) & (ps <= 1)).all()):
        raise ValueError("top_p must be in (0, 1]")
