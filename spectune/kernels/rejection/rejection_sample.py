"""Chain verification of speculative drafts: greedy and rejection sampling, fused.

Semantics are those of vLLM 0.32's V1 ``rejection_sample`` running its GPU Triton
kernels (see :func:`rejection_sample`). The fused path reads the logits directly and
never writes the softmaxed ``[N, V]`` probabilities:

* ``SPLITS == 1``: one program per draft row does every pass over its row (max and
  argmax; for random requests the softmax denominator, the acceptance test and, only
  when the draft is rejected, the recovered-token argmax), then one small program per
  request walks the chain. Two launches.
* ``SPLITS > 1``: each row is split across ``SPLITS`` programs so that batch 1 still
  fills a GPU; a pass that needs a whole-row value gets it from the previous launch's
  partials. Max/argmax, denominator, accept/recover, chain: four launches (two when
  every request is greedy).

Exactness by construction, whatever the launch configuration:

* the max and argmax are exact (first index on ties; a NaN is the max, as in
  ``torch.argmax``, vLLM's greedy verification);
* the softmax denominator is accumulated in fixed point in ``int64``, so its
  value does not depend on how the vocabulary is tiled or split (integer addition is
  associative); hence the probabilities, the acceptance test and the recovered
  token are bit-identical for every config;
* the recovered argmax takes the lowest index on ties;
* with ``seeds`` the random streams are indexed by (request seed, vocab index) or
  (request seed, draft position), never by tile or program.

With ``temperature``, ``top_k``, ``top_p`` or ``min_p`` the sampling parameters are
folded in (the ``rejection_sample_folded`` family): the logits are raw, a pre-pass finds
each random row's thresholds, and every logit a pass loads is processed as vLLM's
``apply_sampling_constraints`` would have written it (:mod:`spectune.kernels._folding`;
the division correctly rounded, as PyTorch's). The row max needs no pass of its own:
dividing by a positive temperature keeps the order, and no mask drops the largest value.

Against vLLM (torch's float32 softmax) our probabilities differ by a few ulps, so a
decision can differ only where rounding decides a near-tie; see
:mod:`spectune.kernels.rejection.rejection_sample_ref`.

This module holds what decides the family's tokens and timings, and nothing else: the
kernels, their launcher and its input checks. With the numbers the kernels share with
host code (:mod:`~spectune.kernels.rejection.rejection_sample_constants`) it makes the
family's source hash, so the reference, the input generator and the search space live elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

# First, where the import it replaces stood: the order of the statements is part of
# the source hash (see spectune.kernels._code_hash, _MOVED).
from spectune.kernels.rejection.rejection_sample_space import FOLDED as _folded_space  # isort: skip
from spectune.kernels._folding import FoldedRows, fold_rows, load_folded, row_fold
from spectune.kernels._launch import launch_config
from spectune.kernels._reductions import (
    argmax_of_parts,
    chunk_first_max,
    first_max,
    first_max_of_parts,
    split_row,
)
from spectune.kernels._tensors import (
    INDEX_DTYPES,
    LOGITS_DTYPES,
    check_token_ids,
    require_tensor,
)
from spectune.kernels._truncation import ROUNDED_DIV, divide
from spectune.kernels.rejection.rejection_sample_constants import (
    COIN_HIGH_SHIFT,
    COIN_LOW_SHIFT,
    COIN_SCALE,
    COIN_STREAM,
    EXPONENTIAL_FLOOR,
    EXPONENTIAL_SCALE,
    EXPONENTIAL_SHIFT,
    EXPONENTIAL_STREAM,
    FIXED_POINT_BITS,
    MAX_VOCAB,
    PLACEHOLDER_TOKEN_ID,
)
from spectune.kernels.rejection.rejection_sample_space import (
    default_config,
    problem_for,
    search_space,
)

__all__ = ["rejection_sample"]

# The chain walk touches k + 1 scalars per request: one warp is plenty, on any GPU.
_FINALIZE_NUM_WARPS = 1


# --------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------


@triton.jit
def _has_softmax(row_max):
    """Whether a random row has a softmax: its max is finite. Else it holds a NaN or +inf,
    or only -inf, and torch's softmax (vLLM's) is NaN everywhere: the draft is rejected and
    the recovered token is 0 (the residual max(p - q, 0), vLLM's tl.maximum on a GPU,
    is 0 everywhere)."""
    return (row_max - row_max) == 0.0


@triton.jit
def _request_of_row(row, cu_ptr, batch, BLOCK_B: tl.constexpr):
    """Request index and its first row, for a draft row (searching cu_num_draft_tokens)."""
    offs = tl.arange(0, BLOCK_B)
    cu = tl.load(cu_ptr + offs, mask=offs < batch, other=2**31 - 1).to(tl.int64)
    req = tl.sum((cu <= row).to(tl.int32), axis=0)
    start = tl.load(cu_ptr + req - 1, mask=req > 0, other=0).to(tl.int64)
    return req, start


@triton.jit
def _row_fold_max(fold_temp_ptr, fold_min_ptr, fold_key_ptr, row, raw_max, FOLD: tl.constexpr):
    """A random row's fold parameters (see :mod:`spectune.kernels._folding`) and the max
    of its processed logits. Dividing by a positive temperature keeps the order and
    neither min-p nor top-k/top-p drops the largest value, so that max is the raw max
    divided by the temperature."""
    temp, min_value, threshold = row_fold(fold_temp_ptr, fold_min_ptr, fold_key_ptr, row, FOLD)
    row_max = raw_max
    if FOLD:
        row_max = divide(raw_max, temp, FOLD)
    return temp, min_value, threshold, row_max


@triton.jit
def _chunk_sum_fixed(
    x_ptr, lo, vocab, n_tiles, row_max, temp, min_value, threshold,
    BLOCK_V: tl.constexpr, FRAC: tl.constexpr, FOLD: tl.constexpr,
):
    """Sum of exp(x - row_max) over a chunk, in fixed point with FRAC fractional bits."""
    offs = tl.arange(0, BLOCK_V)
    acc = tl.zeros((), tl.int64)
    for t in range(n_tiles):
        idx = lo + t * BLOCK_V + offs
        x = load_folded(x_ptr + idx, idx < vocab, temp, min_value, threshold, FOLD)
        e = tl.exp(x - row_max)
        # e is in [0, 1]: e * 2**FRAC is exact in float64; +0.5 and truncation round it.
        fixed = (e.to(tl.float64) * (2.0**FRAC) + 0.5).to(tl.int64)
        acc += tl.sum(fixed, axis=0)
    return acc


@triton.jit
def _inv_denominator(sum_fixed, FRAC: tl.constexpr):
    """1 / softmax denominator as float32, from its fixed-point value."""
    return (1.0 / (sum_fixed.to(tl.float64) * (2.0 ** (-FRAC)))).to(tl.float32)


@triton.jit
def _uniform_coin(seed, pos):
    """A float64 uniform in (0, 1) from Philox(seed; pos, COIN_STREAM): 52 random bits."""
    c0 = pos.to(tl.uint32)
    z = c0 * 0
    a, b, _, _ = tl.philox(seed, c0, z + COIN_STREAM, z, z)
    bits = (a.to(tl.uint64) << COIN_HIGH_SHIFT) | (b >> COIN_LOW_SHIFT).to(tl.uint64)
    return (bits.to(tl.float64) + 0.5) * COIN_SCALE


@triton.jit
def _inv_exponential(seed, idx):
    """1 / Exp(1) draws, float32, from Philox(seed; vocab index, EXPONENTIAL_STREAM)."""
    c0 = idx.to(tl.uint32)
    z = c0 * 0
    a, _, _, _ = tl.philox(seed, c0, z + EXPONENTIAL_STREAM, z, z)
    u = ((a >> EXPONENTIAL_SHIFT).to(tl.float32) + 0.5) * EXPONENTIAL_SCALE
    q = tl.maximum(-tl.log(u), EXPONENTIAL_FLOOR)
    return 1.0 / q


@triton.jit
def _accept_draft(
    x_ptr, dp_ptr, row, req, pos, draft, row_max, inv_den, u_ptr, seed_ptr, vocab,
    temp, min_value, threshold,
    HAS_DRAFT_PROBS: tl.constexpr, SEEDED: tl.constexpr, FOLD: tl.constexpr,
):
    """vLLM's acceptance test for one random row: draft >= 0, dp(d) > 0, p(d)/dp(d) >= u.

    A draft outside [0, V) (refused by the launcher unless ``validate=False``) is padding:
    rejected, and nothing is read outside the row."""
    valid = (draft >= 0) & (draft < vocab)
    safe_d = tl.where(valid, draft, 0)
    x_d = load_folded(x_ptr + row * vocab + safe_d, True, temp, min_value, threshold, FOLD)
    p_d = tl.exp(x_d - row_max) * inv_den
    if HAS_DRAFT_PROBS:
        dp_d = tl.load(dp_ptr + row * vocab + safe_d).to(tl.float32)
    else:
        dp_d = tl.full((), 1.0, tl.float32)
    if SEEDED:
        u = _uniform_coin(tl.load(seed_ptr + req), pos)
    else:
        u = tl.load(u_ptr + row).to(tl.float64)
    ratio = (p_d / tl.where(dp_d > 0, dp_d, 1.0)).to(tl.float64)
    return valid & (dp_d > 0) & (ratio >= u)


@triton.jit
def _chunk_recover(
    x_ptr, dp_ptr, q_ptr, seed_ptr, row, req, draft, lo, vocab, n_tiles, row_max, inv_den,
    temp, min_value, threshold,
    BLOCK_V: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, SEEDED: tl.constexpr,
    SCORE_DTYPE: tl.constexpr, FOLD: tl.constexpr,
):
    """Argmax over a chunk of residual(v) * inv_q(v); lowest index on ties."""
    offs = tl.arange(0, BLOCK_V)
    best = tl.full((), float("-inf"), SCORE_DTYPE)
    best_idx = lo.to(tl.int32)
    if SEEDED:
        seed = tl.load(seed_ptr + req)
    for t in range(n_tiles):
        idx = lo + t * BLOCK_V + offs
        in_vocab = idx < vocab
        x = load_folded(x_ptr + row * vocab + idx, in_vocab, temp, min_value, threshold, FOLD)
        p = tl.exp(x - row_max) * inv_den
        if HAS_DRAFT_PROBS:
            dp = tl.load(dp_ptr + row * vocab + idx, mask=in_vocab, other=0.0).to(tl.float32)
            # Not tl.maximum: a NaN draft prob must give 0 (as vLLM's on a GPU) on
            # every backend, not NaN (the interpreter's).
            diff = p - dp
            residual = tl.where(diff > 0.0, diff, 0.0)
        else:
            residual = tl.where(idx == draft, 0.0, p)
        if SEEDED:
            inv_q = _inv_exponential(seed, idx)
        else:
            inv_q = tl.load(q_ptr + req * vocab + idx, mask=in_vocab, other=0.0)
        score = residual.to(SCORE_DTYPE) * inv_q.to(SCORE_DTYPE)
        score = tl.where(in_vocab, score, float("-inf"))
        tile_max, tile_arg = tl.max(score, axis=0, return_indices=True)
        if tile_max > best:
            best = tile_max
            best_idx = (lo + t * BLOCK_V + tile_arg).to(tl.int32)
    return best, best_idx


@triton.jit
def _fused_row_kernel(
    x_ptr, dp_ptr, draft_ptr, cu_ptr, greedy_ptr, u_ptr, q_ptr, seed_ptr,
    part_max_ptr, part_arg_ptr, part_score_ptr, part_idx_ptr, accept_ptr,
    fold_temp_ptr, fold_min_ptr, fold_key_ptr,
    vocab, batch, n_tiles,
    BLOCK_V: tl.constexpr, BLOCK_B: tl.constexpr, FRAC: tl.constexpr,
    ALL_GREEDY: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, SEEDED: tl.constexpr,
    SCORE_DTYPE: tl.constexpr, FOLD: tl.constexpr,
):
    """SPLITS == 1: every pass over one draft row, in one program."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * vocab
    zero = tl.zeros((), tl.int64)
    row_max, row_arg = chunk_first_max(x_row, zero, vocab, n_tiles, BLOCK_V)
    tl.store(part_max_ptr + row, row_max)
    tl.store(part_arg_ptr + row, row_arg)
    if not ALL_GREEDY:
        req, start = _request_of_row(row, cu_ptr, batch, BLOCK_B)
        if not tl.load(greedy_ptr + req):
            draft = tl.load(draft_ptr + row).to(tl.int64)
            temp, min_value, threshold, row_max = _row_fold_max(
                fold_temp_ptr, fold_min_ptr, fold_key_ptr, row, row_max, FOLD
            )
            has_softmax = _has_softmax(row_max)
            accepted = tl.full((), 0, tl.int1)
            inv_den = tl.zeros((), tl.float32)
            if has_softmax:
                sum_fixed = _chunk_sum_fixed(
                    x_row, zero, vocab, n_tiles, row_max, temp, min_value, threshold,
                    BLOCK_V, FRAC, FOLD,
                )
                inv_den = _inv_denominator(sum_fixed, FRAC)
                accepted = _accept_draft(
                    x_ptr, dp_ptr, row, req, row - start, draft, row_max, inv_den, u_ptr,
                    seed_ptr, vocab, temp, min_value, threshold, HAS_DRAFT_PROBS, SEEDED,
                    FOLD,
                )
            tl.store(accept_ptr + row, accepted.to(tl.int8))
            # The recovered token matters only where this row's draft is rejected.
            if not accepted:
                score = tl.zeros((), SCORE_DTYPE)
                idx = zero.to(tl.int32)
                if has_softmax:
                    score, idx = _chunk_recover(
                        x_ptr, dp_ptr, q_ptr, seed_ptr, row, req, draft, zero, vocab,
                        n_tiles, row_max, inv_den, temp, min_value, threshold,
                        BLOCK_V, HAS_DRAFT_PROBS, SEEDED, SCORE_DTYPE, FOLD,
                    )
                tl.store(part_score_ptr + row, score)
                tl.store(part_idx_ptr + row, idx)


@triton.jit
def _split_max_kernel(
    x_ptr, part_max_ptr, part_arg_ptr, vocab, n_tiles, chunk,
    SPLITS: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """SPLITS > 1, launch 1: max and argmax of each chunk of each row."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // SPLITS
    lo = (pid % SPLITS) * chunk
    best, best_idx = chunk_first_max(x_ptr + row * vocab, lo, vocab, n_tiles, BLOCK_V)
    tl.store(part_max_ptr + pid, best)
    tl.store(part_arg_ptr + pid, best_idx)


@triton.jit
def _row_max_from_parts(part_max_ptr, row, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr):
    offs = tl.arange(0, BLOCK_S)
    parts = tl.load(part_max_ptr + row * SPLITS + offs, mask=offs < SPLITS, other=float("-inf"))
    row_max, _ = first_max(parts, BLOCK_S)  # NaN if a chunk holds one (tl.max drops it)
    return row_max


@triton.jit
def _split_sum_kernel(
    x_ptr, cu_ptr, greedy_ptr, part_max_ptr, part_sum_ptr,
    fold_temp_ptr, fold_min_ptr, fold_key_ptr, vocab, batch, n_tiles, chunk,
    SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_B: tl.constexpr,
    FRAC: tl.constexpr, FOLD: tl.constexpr,
):
    """SPLITS > 1, launch 2 (random rows): fixed-point softmax denominator of each chunk."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // SPLITS
    req, _ = _request_of_row(row, cu_ptr, batch, BLOCK_B)
    if not tl.load(greedy_ptr + req):
        temp, min_value, threshold, row_max = _row_fold_max(
            fold_temp_ptr, fold_min_ptr, fold_key_ptr, row,
            _row_max_from_parts(part_max_ptr, row, SPLITS, BLOCK_S), FOLD,
        )
        if _has_softmax(row_max):  # else no launch reads this row's sums
            lo = (pid % SPLITS) * chunk
            acc = _chunk_sum_fixed(
                x_ptr + row * vocab, lo, vocab, n_tiles, row_max, temp, min_value, threshold,
                BLOCK_V, FRAC, FOLD,
            )
            tl.store(part_sum_ptr + pid, acc)


@triton.jit
def _split_recover_kernel(
    x_ptr, dp_ptr, draft_ptr, cu_ptr, greedy_ptr, u_ptr, q_ptr, seed_ptr,
    part_max_ptr, part_sum_ptr, part_score_ptr, part_idx_ptr, accept_ptr,
    fold_temp_ptr, fold_min_ptr, fold_key_ptr,
    vocab, batch, n_tiles, chunk,
    SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_B: tl.constexpr,
    FRAC: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, SEEDED: tl.constexpr,
    SCORE_DTYPE: tl.constexpr, FOLD: tl.constexpr,
):
    """SPLITS > 1, launch 3 (random rows): acceptance, and recovered-token partials."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // SPLITS
    split = pid % SPLITS
    req, start = _request_of_row(row, cu_ptr, batch, BLOCK_B)
    if not tl.load(greedy_ptr + req):
        temp, min_value, threshold, row_max = _row_fold_max(
            fold_temp_ptr, fold_min_ptr, fold_key_ptr, row,
            _row_max_from_parts(part_max_ptr, row, SPLITS, BLOCK_S), FOLD,
        )
        has_softmax = _has_softmax(row_max)
        draft = tl.load(draft_ptr + row).to(tl.int64)
        accepted = tl.full((), 0, tl.int1)
        inv_den = tl.zeros((), tl.float32)
        if has_softmax:
            offs = tl.arange(0, BLOCK_S)
            sums = tl.load(part_sum_ptr + row * SPLITS + offs, mask=offs < SPLITS, other=0)
            sum_fixed = tl.sum(sums, axis=0)
            inv_den = _inv_denominator(sum_fixed, FRAC)
            accepted = _accept_draft(
                x_ptr, dp_ptr, row, req, row - start, draft, row_max, inv_den, u_ptr, seed_ptr,
                vocab, temp, min_value, threshold, HAS_DRAFT_PROBS, SEEDED, FOLD,
            )
        if split == 0:
            tl.store(accept_ptr + row, accepted.to(tl.int8))
        if not accepted:
            score = tl.zeros((), SCORE_DTYPE)
            idx = (split * chunk).to(tl.int32)
            if has_softmax:
                score, idx = _chunk_recover(
                    x_ptr, dp_ptr, q_ptr, seed_ptr, row, req, draft, split * chunk, vocab,
                    n_tiles, row_max, inv_den, temp, min_value, threshold,
                    BLOCK_V, HAS_DRAFT_PROBS, SEEDED, SCORE_DTYPE, FOLD,
                )
            tl.store(part_score_ptr + pid, score)
            tl.store(part_idx_ptr + pid, idx)


@triton.jit
def _finalize_kernel(
    out_ptr, draft_ptr, cu_ptr, bonus_ptr, greedy_ptr,
    part_max_ptr, part_arg_ptr, part_score_ptr, part_idx_ptr, accept_ptr,
    max_spec_len,
    SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr,
    ALL_GREEDY: tl.constexpr,
):
    """One program per request: walk the chain, emit tokens, placeholders after a rejection."""
    req = tl.program_id(0).to(tl.int64)
    start = tl.load(cu_ptr + req - 1, mask=req > 0, other=0).to(tl.int64)
    end = tl.load(cu_ptr + req).to(tl.int64)
    n = end - start
    if ALL_GREEDY:
        greedy = True
    else:
        greedy = tl.load(greedy_ptr + req) != 0
    offs = tl.arange(0, BLOCK_K)
    tokens = tl.full((BLOCK_K,), PLACEHOLDER_TOKEN_ID, tl.int32)
    rejected = False
    for pos in range(n):
        if not rejected:
            row = start + pos
            draft = tl.load(draft_ptr + row).to(tl.int32)
            if greedy:
                token = first_max_of_parts(part_max_ptr, part_arg_ptr, row, SPLITS, BLOCK_S)
                accepted = draft == token
            else:
                accepted = tl.load(accept_ptr + row) != 0
                if accepted:
                    token = draft
                else:
                    token = argmax_of_parts(part_score_ptr, part_idx_ptr, row, SPLITS, BLOCK_S)
            tokens = tl.where(offs == pos, token, tokens)
            rejected = not accepted
    if not rejected:
        bonus = tl.load(bonus_ptr + req).to(tl.int32)
        tokens = tl.where(offs == n, bonus, tokens)
    tl.store(out_ptr + req * (max_spec_len + 1) + offs, tokens, mask=offs <= max_spec_len)


# --------------------------------------------------------------------------------------
# Host launcher
# --------------------------------------------------------------------------------------


def rejection_sample(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    *,
    max_spec_len: int,
    draft_probs: torch.Tensor | None = None,
    is_greedy: torch.Tensor | None = None,
    uniform_probs: torch.Tensor | None = None,
    inv_q: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
    config: Mapping[str, int] | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Verify speculative drafts against target logits; vLLM 0.32 V1 semantics.

    Args:
        draft_token_ids: ``[N]`` int32/int64 drafts of all requests, concatenated, in
            ``[0, V)``; ``-1`` (only) marks a padded draft, which is always rejected.
        cu_num_draft_tokens: ``[B]`` int32/int64 inclusive cumulative draft counts.
        target_logits: ``[N, V]`` float32/bfloat16/float16 target logits: with
            temperature, top-k and top-p already applied, or raw when they are passed
            (``temperature``, ``top_k``, ``top_p``, ``min_p``) to be applied inside.
        bonus_token_ids: ``[B]`` or ``[B, 1]`` int32/int64 in ``[0, V)``, emitted when
            every draft of a request is accepted.
        max_spec_len: Most drafts any request has; the output has ``max_spec_len + 1``
            columns.
        draft_probs: ``[N, V]`` float32 drafter probabilities; ``None`` for drafters
            without probabilities (ngram).
        is_greedy: ``[B]`` bool; ``None`` means every request is greedy.
        uniform_probs: ``[N]`` float64/float32 acceptance coins (random requests).
        inv_q: ``[B, V]`` float32/float64 reciprocals of Exp(1) draws (random requests).
        seeds: ``[B]`` int64; instead of ``uniform_probs``/``inv_q`` the kernels draw
            their own (Philox), the same for a seed on any configuration.
        temperature: ``[B]`` float32 per request, positive for random requests (greedy
            ones ignore theirs): folded into the verification, which then reads raw
            logits, as ``logits / temperature`` (vLLM's ``apply_sampling_constraints``).
        top_k: ``[B]`` int32/int64 per request, folded: ``V`` or more (or below 1) keeps
            the row.
        top_p: ``[B]`` float32 per request in ``(0, 1]``, folded; 1 keeps the row.
        min_p: ``[B]`` float32 per request in ``[0, 1]``, folded (after temperature,
            before top-k, as Model Runner V2's sampler); 0 keeps the row.
        config: Launch configuration (see
            :func:`~spectune.kernels.rejection.rejection_sample_space.search_space`, and
            its ``FOLDED`` space when sampling
            parameters are folded); ``None`` uses the default config of the launch's
            problem.
        validate: Check values that need the tensors' contents (monotonic
            ``cu_num_draft_tokens``, draft counts, draft and bonus ids: one sync for the
            ids together) as well as shapes and dtypes. Callers that guarantee them (the
            vLLM hook) pass ``False`` to avoid device syncs; a draft id outside
            ``[0, V)`` then counts as padding (nothing outside its row is read).

    Returns:
        ``[B, max_spec_len + 1]`` int32 tokens; ``PLACEHOLDER_TOKEN_ID`` (-1) where
        nothing was emitted. Non-finite inputs give defined tokens in ``[0, V)``, those of
        :func:`~spectune.kernels.rejection.rejection_sample_reference`: a greedy row's token is its
        ``torch.argmax`` (the first NaN if it holds one); a random row without a softmax
        (a NaN or +inf logit, or only -inf: vLLM's softmax is NaN there) rejects its draft
        and recovers token 0; a NaN draft probability rejects its draft and leaves a
        residual of 0 (vLLM's ``tl.maximum(p - q, 0)`` on a GPU).

    Raises:
        ValueError: naming the offending argument, before any launch.
    """
    args = _check_inputs(
        draft_token_ids, cu_num_draft_tokens, target_logits, bonus_token_ids,
        max_spec_len=max_spec_len, draft_probs=draft_probs, is_greedy=is_greedy,
        uniform_probs=uniform_probs, inv_q=inv_q, seeds=seeds, temperature=temperature,
        top_k=top_k, top_p=top_p, min_p=min_p, validate=validate,
    )
    n_rows, vocab = target_logits.shape
    batch = cu_num_draft_tokens.shape[0]
    space = _folded_space if args.fold is not None else None
    config, launch_opts = launch_config(
        config, target_logits.device,
        search_space=search_space if space is None else space.search_space,
        default_config=default_config if space is None else space.default_config,
        problem=lambda: problem_for(
            max_spec_len=max_spec_len, batch=batch, vocab=vocab, dtype=target_logits.dtype,
            draft_probs=draft_probs is not None,
        ),
    )
    return _launch(
        args, n_rows=n_rows, vocab=vocab, batch=batch, max_spec_len=max_spec_len,
        config=config, launch_opts=launch_opts,
    )


@dataclass
class _Args:
    draft: torch.Tensor
    cu: torch.Tensor
    logits: torch.Tensor
    bonus: torch.Tensor
    draft_probs: torch.Tensor | None
    is_greedy: torch.Tensor | None
    uniform_probs: torch.Tensor | None
    inv_q: torch.Tensor | None
    seeds: torch.Tensor | None
    fold: _Fold | None = None


@dataclass
class _Fold:
    """Per-request sampling parameters to fold (greedy requests at temperature 0)."""

    temperature: torch.Tensor
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None


def _fold_rows(args: _Args, fold: _Fold, n_rows: int, config: Mapping[str, int],
               launch_opts: dict[str, Any]) -> FoldedRows:
    """The pre-pass: each row's fold parameters, from its request's."""
    # The request of each row, on the device (no sync): rows before cu[i] belong to i.
    rows = torch.arange(n_rows, device=args.cu.device, dtype=args.cu.dtype)
    row_request = torch.searchsorted(args.cu, rows, right=True)
    return fold_rows(
        args.logits, row_request, fold.temperature, min_p=fold.min_p, top_k=fold.top_k,
        top_p=fold.top_p, div=ROUNDED_DIV.value, config=config, launch_opts=launch_opts,
    )


def _launch(
    args: _Args, *, n_rows: int, vocab: int, batch: int, max_spec_len: int,
    config: Mapping[str, int], launch_opts: dict[str, Any],
) -> torch.Tensor:
    device = args.logits.device
    out = torch.empty((batch, max_spec_len + 1), dtype=torch.int32, device=device)
    if batch == 0:
        return out
    all_greedy = args.is_greedy is None
    seeded = args.seeds is not None
    block_v, tiles_per_split, splits, chunk = split_row(vocab, config["BLOCK_V"], config["SPLITS"])
    score_dtype = (
        torch.float64 if args.inv_q is not None and args.inv_q.dtype == torch.float64
        else torch.float32
    )

    parts = max(n_rows * splits, 1)
    part_max = torch.empty(parts, dtype=torch.float32, device=device)
    part_arg = torch.empty(parts, dtype=torch.int32, device=device)
    part_score = torch.empty(parts, dtype=score_dtype, device=device)
    part_idx = torch.empty(parts, dtype=torch.int32, device=device)
    accept = torch.empty(max(n_rows, 1), dtype=torch.int8, device=device)

    # Absent optional tensors are never read (constexpr flags); any pointer stands in.
    greedy = args.is_greedy if args.is_greedy is not None else accept
    dp = args.draft_probs if args.draft_probs is not None else part_max
    u = args.uniform_probs if args.uniform_probs is not None else part_max
    q = args.inv_q if args.inv_q is not None else part_max
    seeds = args.seeds if args.seeds is not None else part_arg

    tl_score = tl.float64 if score_dtype == torch.float64 else tl.float32
    block_b = triton.next_power_of_2(batch)
    block_s = triton.next_power_of_2(splits)
    # Folded rows are divided as vLLM V1 divides them: PyTorch's correctly rounded
    # quotient (0: not folded).
    fold = ROUNDED_DIV.value if args.fold is not None and not all_greedy and n_rows > 0 else 0
    flags = {"HAS_DRAFT_PROBS": args.draft_probs is not None, "SEEDED": seeded, "FOLD": fold}
    if fold:
        assert args.fold is not None
        folded = _fold_rows(args, args.fold, n_rows, config, launch_opts)
        fold_ptrs = (folded.temp, folded.min_value, folded.threshold)
    else:
        fold_ptrs = (part_max, part_max, part_arg)  # never read (FOLD is a constexpr)

    if n_rows > 0 and splits == 1:
        _fused_row_kernel[(n_rows,)](
            args.logits, dp, args.draft, args.cu, greedy, u, q, seeds,
            part_max, part_arg, part_score, part_idx, accept, *fold_ptrs,
            vocab, batch, tiles_per_split,  # one split: it holds every tile
            BLOCK_V=block_v, BLOCK_B=block_b, FRAC=FIXED_POINT_BITS,
            ALL_GREEDY=all_greedy, SCORE_DTYPE=tl_score, **flags, **launch_opts,
        )
    elif n_rows > 0:
        grid = (n_rows * splits,)
        _split_max_kernel[grid](
            args.logits, part_max, part_arg, vocab, tiles_per_split, chunk,
            SPLITS=splits, BLOCK_V=block_v, **launch_opts,
        )
        if not all_greedy:
            part_sum = torch.empty(parts, dtype=torch.int64, device=device)
            _split_sum_kernel[grid](
                args.logits, args.cu, greedy, part_max, part_sum, *fold_ptrs, vocab, batch,
                tiles_per_split, chunk,
                SPLITS=splits, BLOCK_S=block_s, BLOCK_V=block_v, BLOCK_B=block_b,
                FRAC=FIXED_POINT_BITS, FOLD=fold, **launch_opts,
            )
            _split_recover_kernel[grid](
                args.logits, dp, args.draft, args.cu, greedy, u, q, seeds,
                part_max, part_sum, part_score, part_idx, accept, *fold_ptrs,
                vocab, batch, tiles_per_split, chunk,
                SPLITS=splits, BLOCK_S=block_s, BLOCK_V=block_v, BLOCK_B=block_b,
                FRAC=FIXED_POINT_BITS, SCORE_DTYPE=tl_score, **flags, **launch_opts,
            )
    _finalize_kernel[(batch,)](
        out, args.draft, args.cu, args.bonus, greedy,
        part_max, part_arg, part_score, part_idx, accept,
        max_spec_len,
        SPLITS=splits, BLOCK_S=block_s, BLOCK_K=triton.next_power_of_2(max_spec_len + 1),
        ALL_GREEDY=all_greedy, num_warps=_FINALIZE_NUM_WARPS,
    )
    return out


# --------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------


def _check_inputs(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    *,
    max_spec_len: int,
    draft_probs: torch.Tensor | None,
    is_greedy: torch.Tensor | None,
    uniform_probs: torch.Tensor | None,
    inv_q: torch.Tensor | None,
    seeds: torch.Tensor | None,
    temperature: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    validate: bool,
) -> _Args:
    require_tensor("target_logits", target_logits, ndim=2, dtypes=LOGITS_DTYPES)
    n_rows, vocab = target_logits.shape
    on = ("target_logits", target_logits.device)
    if vocab < 1:
        raise ValueError("target_logits: vocab size (dim 1) must be at least 1")
    if vocab > MAX_VOCAB:
        raise ValueError(f"target_logits: vocab size {vocab} exceeds the supported {MAX_VOCAB}")
    if isinstance(max_spec_len, bool) or not isinstance(max_spec_len, int) or max_spec_len < 0:
        raise ValueError(f"max_spec_len must be a non-negative int, got {max_spec_len!r}")
    require_tensor("draft_token_ids", draft_token_ids, ndim=1, dtypes=INDEX_DTYPES,
                   same_device_as=on, shape=(n_rows,))
    require_tensor("cu_num_draft_tokens", cu_num_draft_tokens, ndim=1, dtypes=INDEX_DTYPES,
                   same_device_as=on)
    batch = cu_num_draft_tokens.shape[0]
    require_tensor("bonus_token_ids", bonus_token_ids, dtypes=INDEX_DTYPES, same_device_as=on)
    if tuple(bonus_token_ids.shape) not in ((batch,), (batch, 1)):
        raise ValueError(
            f"bonus_token_ids must have shape [{batch}] or [{batch}, 1], "
            f"got {list(bonus_token_ids.shape)}"
        )
    if draft_probs is not None:
        require_tensor("draft_probs", draft_probs, ndim=2, dtypes=(torch.float32,),
                       same_device_as=on, shape=(n_rows, vocab))
    if is_greedy is not None:
        require_tensor("is_greedy", is_greedy, ndim=1, dtypes=(torch.bool,), same_device_as=on,
                       shape=(batch,))
    if uniform_probs is not None:
        require_tensor("uniform_probs", uniform_probs, ndim=1,
                       dtypes=(torch.float64, torch.float32), same_device_as=on, shape=(n_rows,))
    if inv_q is not None:
        require_tensor("inv_q", inv_q, ndim=2, dtypes=(torch.float32, torch.float64),
                       same_device_as=on, shape=(batch, vocab))
    if seeds is not None:
        require_tensor("seeds", seeds, ndim=1, dtypes=(torch.int64,), same_device_as=on,
                       shape=(batch,))
        if uniform_probs is not None or inv_q is not None:
            raise ValueError("seeds: pass either seeds or uniform_probs/inv_q, not both")
    has_random_inputs = seeds is not None or (uniform_probs is not None and inv_q is not None)
    if is_greedy is not None and not has_random_inputs:
        if uniform_probs is None and inv_q is None and seeds is None:
            missing = "uniform_probs and inv_q (or seeds)"
        else:
            missing = "inv_q" if inv_q is None else "uniform_probs"
        # Requests marked random need coins; all-greedy masks are fine without them.
        if not bool(is_greedy.all()):
            raise ValueError(f"{missing} required: is_greedy marks random requests")
        is_greedy = None
    if validate and batch > 0:
        cu = cu_num_draft_tokens.to(torch.int64)
        counts = torch.diff(cu, prepend=cu.new_zeros(1))
        if bool((counts < 0).any()):
            raise ValueError("cu_num_draft_tokens must be non-decreasing and non-negative")
        if int(cu[-1]) != n_rows:
            raise ValueError(
                f"cu_num_draft_tokens[-1] = {int(cu[-1])} must equal the number of draft "
                f"rows ({n_rows})"
            )
        if int(counts.max()) > max_spec_len:
            raise ValueError(
                f"cu_num_draft_tokens: a request has {int(counts.max())} drafts, more than "
                f"max_spec_len = {max_spec_len}"
            )
        # Only -1 pads: any other id outside [0, V) is refused, not taken as padding.
        check_token_ids({"draft_token_ids": draft_token_ids, "bonus_token_ids": bonus_token_ids},
                        vocab=vocab, padding=("draft_token_ids",))
    elif batch == 0 and n_rows != 0:
        raise ValueError("cu_num_draft_tokens is empty but draft_token_ids is not")
    fold = _check_fold(temperature, top_k, top_p, min_p, is_greedy, batch=batch, on=on,
                       validate=validate)
    return _Args(
        draft=draft_token_ids,
        cu=cu_num_draft_tokens,
        logits=target_logits,
        bonus=bonus_token_ids.reshape(batch).contiguous(),
        draft_probs=draft_probs,
        is_greedy=is_greedy,
        uniform_probs=uniform_probs if is_greedy is not None and seeds is None else None,
        inv_q=inv_q if is_greedy is not None and seeds is None else None,
        seeds=seeds if is_greedy is not None else None,
        fold=fold,
    )


def _check_fold(
    temperature: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    is_greedy: torch.Tensor | None,
    *,
    batch: int,
    on: tuple[str, torch.device],
    validate: bool,
) -> _Fold | None:
    """The sampling parameters to fold, checked; ``None`` when none are given."""
    if temperature is None and top_k is None and top_p is None and min_p is None:
        return None
    for name, value, dtypes in (("temperature", temperature, (torch.float32,)),
                                ("top_k", top_k, INDEX_DTYPES),
                                ("top_p", top_p, (torch.float32,)),
                                ("min_p", min_p, (torch.float32,))):
        if value is not None:
            require_tensor(name, value, ndim=1, dtypes=dtypes, same_device_as=on,
                           shape=(batch,))
    if temperature is None:
        temperature = torch.ones(batch, dtype=torch.float32, device=on[1])
    if validate and batch > 0:
        random = ~is_greedy.cpu() if is_greedy is not None else torch.zeros(batch, dtype=torch.bool)
        temps = temperature.cpu()[random]
        if not bool(torch.isfinite(temps).all()) or bool((temps <= 0).any()):
            raise ValueError("temperature must be finite and positive for random requests")
        if top_p is not None and not bool(((top_p > 0) & (top_p <= 1)).all()):
            raise ValueError("top_p must be in (0, 1]")
        if min_p is not None and not bool(((min_p >= 0) & (min_p <= 1)).all()):
            raise ValueError("min_p must be in [0, 1]")
    if is_greedy is not None:
        # Greedy requests are not folded (the pre-pass skips temperature 0).
        temperature = torch.where(is_greedy, 0.0, temperature)
    return _Fold(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


