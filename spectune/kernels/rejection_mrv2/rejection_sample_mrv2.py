"""Chain verification with Model Runner V2's semantics: greedy and probabilistic, tuned.

Semantics are those of vLLM 0.32's MRV2 ``rejection_sample``
(``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py``) with its default method
(Leviathan et al.'s probability-ratio test), and it takes the same arguments: the
target logits of every position (``[num_logits, V]``: each request's draft rows, then
its bonus row), the drafter's logits if it has them (pre-temperature, indexed by
request state and draft step), the drafted ids shifted by one (``draft_sampled[r + 1]``
is the draft that row ``r`` verifies; ``-1`` a placeholder), per-request temperature
(0 = greedy) and seed. Per request it returns the accepted drafts and one more token: the
target argmax (greedy), or a Gumbel-max draw from the residual ``max(p - q, 0)`` where a
draft is rejected and from ``p`` where all pass.

The random numbers are vLLM's, bit for bit: the coin of row ``r`` is
``max(tl.rand(seed, pos[r]), COIN_FLOOR)``, the Gumbel noise of token ``v`` a MurmurHash3
of ``(seed, pos[r], v)`` (see :mod:`spectune.kernels._counter_rng`).

Three launches, whatever the config:

1. *stats* (one program per row and split): greedy rows, the max and first argmax of
   the target logits; random rows with a draft, the max and fixed-point softmax sum of
   every :data:`GROUP` logits of the target (and of the draft logits over temperature).
2. *decide* (random rows): the log-normaliser from the group statistics and the
   acceptance test; then, on the one row where the request's chain stops (a rejected
   draft, a placeholder, or the bonus row when every draft passes; each program checks
   the earlier drafts from their group statistics), the Gumbel-max argmax over the row's
   residual. Like vLLM, one pass over one row per request.
3. *chain* (one program per request): walk the drafts, emit tokens and the count.

Exact by construction, whatever the config: a group's max is exact and its sum is an
integer, the groups combine with integer addition, and every argmax keeps the lowest
index on ties; so the log-normalisers, every decision and every token are the same for
every tile size, split and warp count. vLLM sums float32 partials of 8192-logit blocks,
so its normalisers (and ours) are a few ulps from the exact value: a decision may
differ from vLLM's only where that decides a near-tie (see
:mod:`spectune.kernels.rejection_mrv2.rejection_sample_mrv2_ref`). Greedy tokens,
and residuals that use no normaliser (drafters without logits, bonus rows), are bit-identical.

With ``apply_sampling_params`` the target logits are raw and the sampling parameters
are folded in (the ``rejection_sample_mrv2_folded`` family): a pre-pass finds each row's
min-p and top-k/top-p thresholds, and every target logit the passes load is processed as
``Sampler.apply_sampling_params`` would have written it (:mod:`spectune.kernels._folding`;
the division Triton's, as vLLM's temperature kernel's), so the fp32 ``[N, V]`` buffer
vLLM writes first is never written.

Block verification, synthetic acceptance rates, watermarking and a draft vocabulary
narrower than the target's are not implemented (the vLLM router sends those calls to
vLLM). This module, with
:mod:`spectune.kernels.rejection_mrv2.rejection_sample_mrv2_constants`, the random
streams of :mod:`spectune.kernels._counter_rng` and the shared reductions of
:mod:`spectune.kernels._reductions`, makes the family's source hash.
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
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_space import FOLDED as _folded_space  # isort: skip
from spectune.kernels._counter_rng import coin, gumbel_noise
from spectune.kernels._folding import fold, fold_rows, load_folded, row_fold
from spectune.kernels._launch import launch_config
from spectune.kernels._reductions import (
    chunk_first_max,
    first_max,
    first_max_of_parts,
    later_wins,
    split_row,
)
from spectune.kernels._tensors import (
    INDEX_DTYPES,
    LOGITS_DTYPES,
    check_token_ids,
    require_tensor,
)
from spectune.kernels._truncation import TRITON_DIV
from spectune.kernels.rejection.rejection_sample_constants import FIXED_POINT_BITS, MAX_VOCAB
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_constants import (
    GROUP,
    PLACEHOLDER_TOKEN_ID,
)
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_space import (
    default_config,
    problem_for,
    search_space,
)

__all__ = ["rejection_sample_mrv2"]

# The chain walk touches k + 1 scalars per request: one warp is plenty, on any GPU.
_CHAIN_NUM_WARPS = 1


# --------------------------------------------------------------------------------------
# Softmax statistics in exact groups
# --------------------------------------------------------------------------------------


@triton.jit
def _group_stats(x, BLOCK: tl.constexpr, FRAC: tl.constexpr):
    """Max and fixed-point sum of exp(x - max) of every GROUP logits of a tile.

    A group holding a NaN has max NaN, one holding +inf max +inf (its sum is then not
    used): the row's normaliser becomes what ``torch.logsumexp`` gives
    (:func:`_log_normaliser`). tl.max never sees a NaN (a GPU's reduction order would
    decide what it returns)."""
    grouped = tl.reshape(x, (BLOCK // GROUP, GROUP))
    nan = grouped != grouped
    clean = tl.where(nan, float("-inf"), grouped)
    gmax = tl.max(clean, axis=1)
    # -inf: an empty group (sum 0); +inf: no finite shift (and no sum needed).
    finite = (gmax - gmax) == 0.0
    e = tl.exp(clean - tl.where(finite, gmax, 0.0)[:, None])
    e = tl.where(finite[:, None], e, 0.0)
    # e is in [0, 1]: e * 2**FRAC is exact in float64; +0.5 and truncation round it.
    fixed = (e.to(tl.float64) * (2.0**FRAC) + 0.5).to(tl.int64)
    has_nan = tl.max(nan.to(tl.int32), axis=1) > 0
    return tl.where(has_nan, float("nan"), gmax), tl.sum(fixed, axis=1)


@triton.jit
def _chunk_group_stats(
    x_ptr, gmax_ptr, gsum_ptr, lo, vocab, n_tiles, n_groups, temp, min_value, threshold,
    BLOCK_V: tl.constexpr, FRAC: tl.constexpr, FOLD: tl.constexpr,
):
    """Group statistics of x[lo : lo + n_tiles * BLOCK_V] / temp (folded with ``FOLD``:
    min-p and top-k/top-p masks too), stored per group."""
    offs = tl.arange(0, BLOCK_V)
    groups = tl.arange(0, BLOCK_V // GROUP)
    for t in range(n_tiles):
        start = lo + t * BLOCK_V
        idx = start + offs
        x = tl.load(x_ptr + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
        if FOLD:
            x = fold(x, temp, min_value, threshold, FOLD)
        else:
            x = x / temp
        gmax, gsum = _group_stats(x, BLOCK_V, FRAC)
        g = start // GROUP + groups
        tl.store(gmax_ptr + g, gmax, mask=g < n_groups)
        tl.store(gsum_ptr + g, gsum, mask=g < n_groups)


@triton.jit
def _log_normaliser(gmax_ptr, gsum_ptr, n_groups, BLOCK_G: tl.constexpr, FRAC: tl.constexpr):
    """log(sum(exp(x))) of a row from its group statistics, the same for every config;
    as ``torch.logsumexp``: NaN if the row holds a NaN, else +inf if it holds +inf, -inf
    if it holds only -inf."""
    offs = tl.arange(0, BLOCK_G)
    valid = offs < n_groups
    gmax = tl.load(gmax_ptr + offs, mask=valid, other=float("-inf"))
    gsum = tl.load(gsum_ptr + offs, mask=valid, other=0)
    nan = gmax != gmax
    clean = tl.where(nan, float("-inf"), gmax)
    row_max = tl.max(clean, axis=0)
    finite = (row_max - row_max) == 0.0
    # Each group's sum rescaled to the row max and rounded to an integer: the total is
    # an integer sum, independent of order.
    scale = tl.where(finite, tl.exp(clean - tl.where(finite, row_max, 0.0)), 0.0).to(tl.float64)
    scaled = (gsum.to(tl.float64) * scale + 0.5).to(tl.int64)
    total = tl.sum(tl.where(valid, scaled, 0), axis=0)
    lse = row_max + tl.log((total.to(tl.float64) * (2.0 ** (-FRAC))).to(tl.float32))
    lse = tl.where(finite, lse, row_max)
    return tl.where(tl.max(nan.to(tl.int32), axis=0) > 0, float("nan"), lse)


@triton.jit
def _log1m(r):
    """log(1 - r) for r in [0, 1), to a few ulps (the rounding of 1 - r corrected)."""
    w = 1.0 - r
    exact = w == 1.0
    return tl.where(exact, -r, tl.log(w) * (-r) / tl.where(exact, -1.0, w - 1.0))


@triton.jit
def _row_of_program(pid, cu_ptr, SPLITS: tl.constexpr, STEPS: tl.constexpr):
    """(request, step, split, first row, drafts) of a program; step > drafts: no row."""
    split = pid % SPLITS
    slot = pid // SPLITS
    req = slot // (STEPS + 1)
    step = slot % (STEPS + 1)
    start = tl.load(cu_ptr + req).to(tl.int64)
    n_drafts = tl.load(cu_ptr + req + 1).to(tl.int64) - start - 1
    return req, step, split, start, n_drafts


@triton.jit
def _stats_kernel(
    t_ptr, t_stride, d_ptr, d_stride0, d_stride1, drafts_ptr, cu_ptr, idx_map_ptr, temp_ptr,
    part_max_ptr, part_arg_ptr, t_gmax_ptr, t_gsum_ptr, d_gmax_ptr, d_gsum_ptr,
    fold_temp_ptr, fold_min_ptr, fold_key_ptr,
    vocab, n_groups, n_tiles, chunk,
    STEPS: tl.constexpr, SPLITS: tl.constexpr, BLOCK_V: tl.constexpr, FRAC: tl.constexpr,
    HAS_DRAFT_LOGITS: tl.constexpr, FOLD: tl.constexpr,
):
    """Launch 1: target max/argmax of greedy rows; group statistics of random draft rows."""
    pid = tl.program_id(0).to(tl.int64)
    req, step, split, start, n_drafts = _row_of_program(pid, cu_ptr, SPLITS, STEPS)
    if step <= n_drafts:
        row = start + step
        state = tl.load(idx_map_ptr + req).to(tl.int64)
        temp = tl.load(temp_ptr + state).to(tl.float32)
        lo = split * chunk
        if temp == 0.0:
            best, best_idx = chunk_first_max(
                t_ptr + row * t_stride, lo, vocab, n_tiles, BLOCK_V
            )
            tl.store(part_max_ptr + row * SPLITS + split, best)
            tl.store(part_arg_ptr + row * SPLITS + split, best_idx)
        elif step < n_drafts:  # (not `and`: the load would read past a bonus row's drafts)
            next_id = tl.load(drafts_ptr + row + 1)
            if (next_id >= 0) & (next_id < vocab):  # else a placeholder: nothing to test
                f_temp, f_min, f_key = row_fold(
                    fold_temp_ptr, fold_min_ptr, fold_key_ptr, row, FOLD
                )
                _chunk_group_stats(
                    t_ptr + row * t_stride, t_gmax_ptr + row * n_groups,
                    t_gsum_ptr + row * n_groups, lo, vocab, n_tiles, n_groups, f_temp, f_min,
                    f_key, BLOCK_V, FRAC, FOLD,
                )
                if HAS_DRAFT_LOGITS:
                    # Draft logits are stored before temperature: divide as vLLM does.
                    _chunk_group_stats(
                        d_ptr + state * d_stride0 + step * d_stride1,
                        d_gmax_ptr + row * n_groups, d_gsum_ptr + row * n_groups,
                        lo, vocab, n_tiles, n_groups, temp, 0.0, 0, BLOCK_V, FRAC, False,
                    )


@triton.jit
def _accepts(
    t_ptr, t_stride, d_ptr, d_stride0, d_stride1, t_gmax_ptr, t_gsum_ptr, d_gmax_ptr,
    d_gsum_ptr, fold_temp_ptr, fold_min_ptr, fold_key_ptr, row, step, draft, state, temp,
    seed, pos, n_groups,
    BLOCK_G: tl.constexpr, FRAC: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr,
    FOLD: tl.constexpr,
):
    """vLLM's test of a random row's (valid) draft: log p(d) > log u + log q(d).

    Returns (accepted, log-normaliser of the target row, of the draft row).
    """
    t_lse = _log_normaliser(
        t_gmax_ptr + row * n_groups, t_gsum_ptr + row * n_groups, n_groups, BLOCK_G, FRAC
    )
    f_temp, f_min, f_key = row_fold(fold_temp_ptr, fold_min_ptr, fold_key_ptr, row, FOLD)
    t_logp = load_folded(t_ptr + row * t_stride + draft, True, f_temp, f_min, f_key, FOLD)
    t_logp = t_logp - t_lse
    d_lse = tl.zeros((), tl.float32)
    d_logp = tl.zeros((), tl.float32)
    if HAS_DRAFT_LOGITS:
        d_lse = _log_normaliser(
            d_gmax_ptr + row * n_groups, d_gsum_ptr + row * n_groups, n_groups, BLOCK_G, FRAC
        )
        d_row = d_ptr + state * d_stride0 + step * d_stride1
        d_logp = tl.load(d_row + draft).to(tl.float32) / temp - d_lse
    return t_logp > tl.log(coin(seed, pos)) + d_logp, t_lse, d_lse


@triton.jit
def _decide_kernel(
    t_ptr, t_stride, d_ptr, d_stride0, d_stride1, drafts_ptr, cu_ptr, idx_map_ptr, temp_ptr,
    seed_ptr, pos_ptr, t_gmax_ptr, t_gsum_ptr, d_gmax_ptr, d_gsum_ptr,
    accept_ptr, part_score_ptr, part_idx_ptr, fold_temp_ptr, fold_min_ptr, fold_key_ptr,
    vocab, n_groups, n_tiles, chunk,
    STEPS: tl.constexpr, SPLITS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr,
    FRAC: tl.constexpr, HAS_DRAFT_LOGITS: tl.constexpr, USE_FP64: tl.constexpr,
    FOLD: tl.constexpr,
):
    """Launch 2 (random rows): acceptance, and the Gumbel-max argmax where it is needed."""
    pid = tl.program_id(0).to(tl.int64)
    req, step, split, start, n_drafts = _row_of_program(pid, cu_ptr, SPLITS, STEPS)
    if step <= n_drafts:
        row = start + step
        state = tl.load(idx_map_ptr + req).to(tl.int64)
        temp = tl.load(temp_ptr + state).to(tl.float32)
        if temp != 0.0:
            seed = tl.load(seed_ptr + state)
            pos = tl.load(pos_ptr + row)
            is_draft_row = step < n_drafts
            # The bonus row has no draft (and the batch's last row no next id to read).
            draft = tl.load(drafts_ptr + tl.where(is_draft_row, row + 1, row)).to(tl.int64)
            draft = tl.where(is_draft_row, draft, -1)
            # Only the row where the chain stops needs a token drawn: skip this one if an
            # earlier draft of the request is a placeholder or is rejected (their tests
            # cost a few loads of group statistics, the draw a pass over the row).
            reached = True
            for j in range(step):
                if reached:
                    earlier = tl.load(drafts_ptr + start + j + 1).to(tl.int64)
                    reached = (earlier >= 0) & (earlier < vocab)
                    if reached:
                        reached, _, _ = _accepts(
                            t_ptr, t_stride, d_ptr, d_stride0, d_stride1, t_gmax_ptr,
                            t_gsum_ptr, d_gmax_ptr, d_gsum_ptr, fold_temp_ptr, fold_min_ptr,
                            fold_key_ptr, start + j, j, earlier, state, temp, seed,
                            tl.load(pos_ptr + start + j), n_groups,
                            BLOCK_G, FRAC, HAS_DRAFT_LOGITS, FOLD,
                        )
            # A bonus row, or a placeholder that ends the chain: sample from p itself. An id
            # outside [0, V) (refused unless validate=False) is a placeholder too.
            plain = (draft < 0) | (draft >= vocab)
            accepted = tl.full((), 0, tl.int1)
            t_lse = tl.zeros((), tl.float32)
            d_lse = tl.zeros((), tl.float32)
            if reached and not plain:
                accepted, t_lse, d_lse = _accepts(
                    t_ptr, t_stride, d_ptr, d_stride0, d_stride1, t_gmax_ptr, t_gsum_ptr,
                    d_gmax_ptr, d_gsum_ptr, fold_temp_ptr, fold_min_ptr, fold_key_ptr, row,
                    step, draft, state, temp, seed, pos, n_groups, BLOCK_G, FRAC,
                    HAS_DRAFT_LOGITS, FOLD,
                )
            if reached and split == 0:
                # Also for a placeholder past V, which the chain reads as a rejected draft.
                tl.store(accept_ptr + row, accepted.to(tl.int8))
            if reached and not accepted:
                f_temp, f_min, f_key = row_fold(
                    fold_temp_ptr, fold_min_ptr, fold_key_ptr, row, FOLD
                )
                offs = tl.arange(0, BLOCK_R)
                lo = split * chunk
                best = tl.full((), float("-inf"), tl.float64 if USE_FP64 else tl.float32)
                best_idx = lo.to(tl.int32)
                for t in range(n_tiles):
                    idx = lo + t * BLOCK_R + offs
                    in_vocab = idx < vocab
                    x = load_folded(
                        t_ptr + row * t_stride + idx, in_vocab, f_temp, f_min, f_key, FOLD
                    )
                    if HAS_DRAFT_LOGITS:
                        # A bonus row reads the last step's draft logits and ignores them.
                        d_step = tl.minimum(step, STEPS - 1)
                        d_row = d_ptr + state * d_stride0 + d_step * d_stride1
                        y = tl.load(d_row + idx, mask=in_vocab, other=0.0)
                        t_logp = x - t_lse
                        ratio = tl.exp((y.to(tl.float32) / temp - d_lse) - t_logp)
                        kept = ratio < 1.0
                        residual = tl.where(
                            kept, t_logp + _log1m(tl.where(kept, ratio, 0.0)), float("-inf")
                        )
                    else:
                        residual = tl.where(idx == draft, float("-inf"), x)
                    residual = tl.where(plain, x, residual)
                    if USE_FP64:
                        residual = residual.to(tl.float64)
                    score = residual + gumbel_noise(seed, pos, idx, USE_FP64)
                    score = tl.where(in_vocab, score, float("-inf"))
                    # A NaN logit (no draft logits, or a plain row) wins, as torch.argmax's.
                    tile_best, tile_arg = first_max(score, BLOCK_R)
                    # An earlier tile keeps a tie (lowest index).
                    if later_wins(tile_best, best):
                        best = tile_best
                        best_idx = (lo + t * BLOCK_R + tile_arg).to(tl.int32)
                tl.store(part_score_ptr + row * SPLITS + split, best)
                tl.store(part_idx_ptr + row * SPLITS + split, best_idx)


@triton.jit
def _chain_kernel(
    sampled_ptr, num_sampled_ptr, drafts_ptr, cu_ptr, idx_map_ptr, temp_ptr,
    part_max_ptr, part_arg_ptr, accept_ptr, part_score_ptr, part_idx_ptr,
    STEPS: tl.constexpr, SPLITS_V: tl.constexpr, BLOCK_SV: tl.constexpr,
    SPLITS_R: tl.constexpr, BLOCK_SR: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Launch 3, one program per request: walk the drafts, emit tokens and their count."""
    req = tl.program_id(0).to(tl.int64)
    start = tl.load(cu_ptr + req).to(tl.int64)
    n_drafts = tl.load(cu_ptr + req + 1).to(tl.int64) - start - 1
    state = tl.load(idx_map_ptr + req).to(tl.int64)
    greedy = tl.load(temp_ptr + state).to(tl.float32) == 0.0
    offs = tl.arange(0, BLOCK_K)
    tokens = tl.full((BLOCK_K,), PLACEHOLDER_TOKEN_ID, tl.int64)
    n_accepted = tl.zeros((), tl.int32)
    verifying = True
    for step in range(n_drafts):
        if verifying:
            row = start + step
            draft = tl.load(drafts_ptr + row + 1).to(tl.int64)
            if greedy:
                token = first_max_of_parts(
                    part_max_ptr, part_arg_ptr, row, SPLITS_V, BLOCK_SV
                ).to(tl.int64)
                accepted = token == draft
            elif draft < 0:
                token = first_max_of_parts(
                    part_score_ptr, part_idx_ptr, row, SPLITS_R, BLOCK_SR
                ).to(tl.int64)
                accepted = tl.full((), 0, tl.int1)
            else:
                accepted = tl.load(accept_ptr + row) != 0
                token = draft
                if not accepted:
                    token = first_max_of_parts(
                        part_score_ptr, part_idx_ptr, row, SPLITS_R, BLOCK_SR
                    ).to(tl.int64)
            tokens = tl.where(offs == step, token, tokens)
            n_accepted += accepted.to(tl.int32)
            verifying = accepted
    if verifying:
        row = start + n_drafts
        if greedy:
            token = first_max_of_parts(part_max_ptr, part_arg_ptr, row, SPLITS_V, BLOCK_SV)
        else:
            token = first_max_of_parts(part_score_ptr, part_idx_ptr, row, SPLITS_R, BLOCK_SR)
        tokens = tl.where(offs == n_drafts, token.to(tl.int64), tokens)
    tl.store(sampled_ptr + req * (STEPS + 1) + offs, tokens, mask=offs <= STEPS)
    tl.store(num_sampled_ptr + req, n_accepted + 1)


# --------------------------------------------------------------------------------------
# Host launcher
# --------------------------------------------------------------------------------------


def rejection_sample_mrv2(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_sampled: torch.Tensor,
    cu_num_logits: torch.Tensor,
    pos: torch.Tensor,
    idx_mapping: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    expanded_local_pos: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    num_speculative_steps: int,
    use_fp64: bool = False,
    *,
    apply_sampling_params: bool = False,
    min_p: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    config: Mapping[str, int] | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify drafts against target logits; vLLM 0.32 Model Runner V2 semantics.

    The positional arguments are those of vLLM's MRV2 ``rejection_sample`` (without its
    block-verification, synthetic-rate and watermarking options).

    Args:
        target_logits: ``[num_logits, V]`` float32/bfloat16/float16, sampling parameters
            already applied, or raw with ``apply_sampling_params``; rows may be strided
            (last dim contiguous). Request ``i``
            owns rows ``cu_num_logits[i]:cu_num_logits[i + 1]``: its drafts' rows, then
            its bonus row.
        draft_logits: ``[max_num_reqs, k, V']`` drafter logits before temperature,
            indexed by request state and draft step (``V' >= V``), or ``None`` for
            drafters without logits (ngram).
        draft_sampled: ``[num_logits]`` int32/int64 in ``[0, V)``; ``draft_sampled[r + 1]``
            is the draft row ``r`` verifies; ``-1`` (only) is a placeholder, never
            accepted.
        cu_num_logits: ``[num_reqs + 1]`` int32/int64 row offsets, starting at 0.
        pos: ``[num_logits]`` int64 position of each row (the random streams' counter).
        idx_mapping: ``[num_reqs]`` request state of each request.
        expanded_idx_mapping: ``[num_logits]`` request state of each row (as
            ``idx_mapping``, repeated per row).
        expanded_local_pos: ``[num_logits]`` step of each row within its request.
        temperature: ``[max_num_reqs]`` float32; 0 means greedy.
        seed: ``[max_num_reqs]`` int64 per-request seeds.
        num_speculative_steps: ``k``, the most drafts a request has.
        use_fp64: Gumbel-max in float64 (vLLM's ``use_fp64_gumbel``).
        apply_sampling_params: Fold the sampling parameters into the verification: the
            target logits are raw, and each value read is processed as vLLM's
            ``Sampler.apply_sampling_params`` would (temperature, then ``min_p``, then
            ``top_k``/``top_p``), without writing the processed rows.
        min_p: ``[max_num_reqs]`` float32 per request state in ``[0, 1]`` (0: none);
            only with ``apply_sampling_params``.
        top_k: ``[max_num_reqs]`` int32/int64 (``V`` or more, or below 1: none); only
            with ``apply_sampling_params``.
        top_p: ``[max_num_reqs]`` float32 in ``(0, 1]`` (1: none); only with
            ``apply_sampling_params``.
        config: Launch configuration (see
            :func:`~spectune.kernels.rejection_mrv2.rejection_sample_mrv2_space.search_space`, and
            its ``FOLDED`` space with
            ``apply_sampling_params``); ``None`` uses the default config of the launch's
            problem.
        validate: Also check what needs the tensors' contents (row offsets, mappings,
            draft ids); callers that guarantee them (the vLLM router) pass ``False``: no
            device sync then, and a draft id outside ``[0, V)`` counts as a placeholder
            (nothing outside its row is read).

    Returns:
        ``(sampled, num_sampled)``: ``[num_reqs, k + 1]`` int64 tokens (``-1`` past each
        request's count) and ``[num_reqs]`` int32 counts (accepted drafts + 1).
        Non-finite logits give defined tokens in ``[0, V)``, those of
        :func:`~spectune.kernels.rejection_mrv2.rejection_sample_mrv2_reference`: a greedy
        row's token is its ``torch.argmax`` (the first NaN if it holds one); a random row's
        normalisers are ``torch.logsumexp``'s (NaN, +inf or -inf), so a NaN or +inf
        target logit, or only -inf, rejects the draft; the Gumbel-max draw is an argmax
        in ``torch.argmax``'s order (a NaN logit of a row sampled from ``p`` is drawn).

    Raises:
        ValueError: naming the offending argument, before any launch.
    """
    args = _check_inputs(
        target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
        expanded_idx_mapping, expanded_local_pos, temperature, seed,
        num_speculative_steps=num_speculative_steps, use_fp64=use_fp64,
        apply_sampling_params=apply_sampling_params, min_p=min_p, top_k=top_k, top_p=top_p,
        validate=validate,
    )
    num_reqs = cu_num_logits.shape[0] - 1
    vocab = target_logits.shape[1]
    space = _folded_space if args.fold is not None else None
    config, launch_opts = launch_config(
        config, target_logits.device,
        search_space=search_space if space is None else space.search_space,
        default_config=default_config if space is None else space.default_config,
        problem=lambda: problem_for(
            num_speculative_steps=num_speculative_steps, num_reqs=num_reqs, vocab=vocab,
            dtype=target_logits.dtype, draft_logits=draft_logits is not None,
        ),
    )
    return _launch(args, num_reqs=num_reqs, vocab=vocab, config=config,
                   launch_opts=launch_opts)


@dataclass
class _Args:
    target: torch.Tensor
    draft: torch.Tensor | None
    drafts: torch.Tensor
    cu: torch.Tensor
    pos: torch.Tensor
    idx_mapping: torch.Tensor
    temperature: torch.Tensor
    seed: torch.Tensor
    steps: int
    use_fp64: bool
    expanded_idx_mapping: torch.Tensor | None = None
    fold: _Fold | None = None


@dataclass
class _Fold:
    """Per-request-state sampling parameters to fold (the temperature is ``_Args``')."""

    min_p: torch.Tensor | None
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None


def _launch(
    args: _Args, *, num_reqs: int, vocab: int, config: Mapping[str, int],
    launch_opts: dict[str, Any],
) -> tuple[torch.Tensor, torch.Tensor]:
    device = args.target.device
    steps = args.steps
    sampled = torch.empty((num_reqs, steps + 1), dtype=torch.int64, device=device)
    num_sampled = torch.empty((num_reqs,), dtype=torch.int32, device=device)
    if num_reqs == 0:
        return sampled, num_sampled
    # Every buffer's size follows from shapes alone: no device sync, nothing data-sized.
    rows = args.target.shape[0]
    n_groups = triton.cdiv(vocab, GROUP.value)
    block_v, tiles_v, splits_v, chunk_v = split_row(
        vocab, config["BLOCK_V"], config["SPLITS"], min_block=GROUP.value
    )
    block_r, tiles_r, splits_r, chunk_r = split_row(
        vocab, config["BLOCK_R"], config["SPLITS"], min_block=GROUP.value
    )
    score_dtype = torch.float64 if args.use_fp64 else torch.float32

    part_max = torch.empty(rows * splits_v, dtype=torch.float32, device=device)
    part_arg = torch.empty(rows * splits_v, dtype=torch.int32, device=device)
    part_score = torch.empty(rows * splits_r, dtype=score_dtype, device=device)
    part_idx = torch.empty(rows * splits_r, dtype=torch.int32, device=device)
    accept = torch.empty(rows, dtype=torch.int8, device=device)
    t_gmax = torch.empty(rows * n_groups, dtype=torch.float32, device=device)
    t_gsum = torch.empty(rows * n_groups, dtype=torch.int64, device=device)
    # With k = 0 every row is a bonus row: draft logits are never read.
    has_draft = args.draft is not None and steps > 0
    if has_draft:
        d_gmax = torch.empty(rows * n_groups, dtype=torch.float32, device=device)
        d_gsum = torch.empty(rows * n_groups, dtype=torch.int64, device=device)
        draft, d_stride0, d_stride1 = args.draft, args.draft.stride(0), args.draft.stride(1)
    else:
        # Never read (HAS_DRAFT_LOGITS is a constexpr); any pointer stands in.
        d_gmax, d_gsum, draft, d_stride0, d_stride1 = t_gmax, t_gsum, args.target, 0, 0

    # Folded rows are divided as vLLM's Triton temperature kernel divides (0: not folded).
    fold = TRITON_DIV.value if args.fold is not None and rows > 0 else 0
    if fold:
        assert args.fold is not None and args.expanded_idx_mapping is not None
        folded = fold_rows(
            args.target, args.expanded_idx_mapping, args.temperature, min_p=args.fold.min_p,
            top_k=args.fold.top_k, top_p=args.fold.top_p, div=TRITON_DIV.value,
            config=config, launch_opts=launch_opts,
        )
        fold_ptrs: tuple[torch.Tensor, ...] = (folded.temp, folded.min_value, folded.threshold)
    else:
        fold_ptrs = (part_max, part_max, part_arg)  # never read (FOLD is a constexpr)

    common = (
        args.target, args.target.stride(0), draft, d_stride0, d_stride1, args.drafts, args.cu,
        args.idx_mapping, args.temperature,
    )
    slots = num_reqs * (steps + 1)
    _stats_kernel[(slots * splits_v,)](
        *common, part_max, part_arg, t_gmax, t_gsum, d_gmax, d_gsum, *fold_ptrs,
        vocab, n_groups, tiles_v, chunk_v,
        STEPS=steps, SPLITS=splits_v, BLOCK_V=block_v, FRAC=FIXED_POINT_BITS,
        HAS_DRAFT_LOGITS=has_draft, FOLD=fold, **launch_opts,
    )
    _decide_kernel[(slots * splits_r,)](
        *common, args.seed, args.pos, t_gmax, t_gsum, d_gmax, d_gsum,
        accept, part_score, part_idx, *fold_ptrs,
        vocab, n_groups, tiles_r, chunk_r,
        STEPS=steps, SPLITS=splits_r, BLOCK_R=block_r,
        BLOCK_G=triton.next_power_of_2(n_groups), FRAC=FIXED_POINT_BITS,
        HAS_DRAFT_LOGITS=has_draft, USE_FP64=args.use_fp64, FOLD=fold, **launch_opts,
    )
    _chain_kernel[(num_reqs,)](
        sampled, num_sampled, args.drafts, args.cu, args.idx_mapping, args.temperature,
        part_max, part_arg, accept, part_score, part_idx,
        STEPS=steps, SPLITS_V=splits_v, BLOCK_SV=triton.next_power_of_2(splits_v),
        SPLITS_R=splits_r, BLOCK_SR=triton.next_power_of_2(splits_r),
        BLOCK_K=triton.next_power_of_2(steps + 1), num_warps=_CHAIN_NUM_WARPS,
    )
    return sampled, num_sampled


# --------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------


def _check_inputs(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_sampled: torch.Tensor,
    cu_num_logits: torch.Tensor,
    pos: torch.Tensor,
    idx_mapping: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    expanded_local_pos: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    *,
    num_speculative_steps: int,
    use_fp64: bool,
    apply_sampling_params: bool,
    min_p: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    validate: bool,
) -> _Args:
    require_tensor("target_logits", target_logits, ndim=2, dtypes=LOGITS_DTYPES, rows=True)
    num_logits, vocab = target_logits.shape
    on = ("target_logits", target_logits.device)
    if vocab < 1:
        raise ValueError("target_logits: vocab size (dim 1) must be at least 1")
    if vocab > MAX_VOCAB:
        raise ValueError(f"target_logits: vocab size {vocab} exceeds the supported {MAX_VOCAB}")
    steps = num_speculative_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"num_speculative_steps must be a non-negative int, got {steps!r}")
    if not isinstance(use_fp64, bool):
        raise ValueError(f"use_fp64 must be a bool, got {use_fp64!r}")
    require_tensor("cu_num_logits", cu_num_logits, ndim=1, dtypes=INDEX_DTYPES,
                   same_device_as=on)
    num_reqs = cu_num_logits.shape[0] - 1
    if num_reqs < 0:
        raise ValueError("cu_num_logits must have num_reqs + 1 entries (at least 1)")
    for name, value, size in (
        ("draft_sampled", draft_sampled, num_logits),
        ("pos", pos, num_logits),
        ("expanded_idx_mapping", expanded_idx_mapping, num_logits),
        ("expanded_local_pos", expanded_local_pos, num_logits),
        ("idx_mapping", idx_mapping, num_reqs),
    ):
        require_tensor(name, value, ndim=1, dtypes=INDEX_DTYPES, same_device_as=on,
                       shape=(size,))
    require_tensor("temperature", temperature, ndim=1, dtypes=(torch.float32,),
                   same_device_as=on)
    require_tensor("seed", seed, ndim=1, dtypes=(torch.int64,), same_device_as=on,
                   shape=tuple(temperature.shape))
    if draft_logits is not None:
        require_tensor("draft_logits", draft_logits, ndim=3, dtypes=LOGITS_DTYPES,
                       same_device_as=on, rows=True)
        if draft_logits.shape[1] < steps:
            raise ValueError(
                f"draft_logits must have at least num_speculative_steps = {steps} draft "
                f"steps (dim 1), got shape {list(draft_logits.shape)}"
            )
        if draft_logits.shape[2] < vocab:
            raise ValueError(
                f"draft_logits: vocab size {draft_logits.shape[2]} is narrower than the "
                f"target's {vocab} (not supported)"
            )
    fold = _check_fold(apply_sampling_params, min_p, top_k, top_p, temperature, on=on,
                       validate=validate)
    if validate and num_reqs > 0:
        _check_contents(
            cu_num_logits, draft_sampled, pos, idx_mapping, expanded_idx_mapping,
            expanded_local_pos, temperature, draft_logits, num_logits=num_logits,
            vocab=vocab, steps=steps,
        )
    return _Args(
        target=target_logits, draft=draft_logits, drafts=draft_sampled, cu=cu_num_logits,
        pos=pos, idx_mapping=idx_mapping, temperature=temperature, seed=seed, steps=steps,
        use_fp64=use_fp64, expanded_idx_mapping=expanded_idx_mapping, fold=fold,
    )


def _check_fold(
    apply_sampling_params: bool,
    min_p: torch.Tensor | None,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    temperature: torch.Tensor,
    *,
    on: tuple[str, torch.device],
    validate: bool,
) -> _Fold | None:
    """The sampling parameters to fold, checked; ``None`` when not folding."""
    if not isinstance(apply_sampling_params, bool):
        raise ValueError(f"apply_sampling_params must be a bool, got {apply_sampling_params!r}")
    given = [name for name, value in (("min_p", min_p), ("top_k", top_k), ("top_p", top_p))
             if value is not None]
    if not apply_sampling_params:
        if given:
            raise ValueError(f"{', '.join(given)}: only with apply_sampling_params=True")
        return None
    states = tuple(temperature.shape)
    for name, value, dtypes in (("min_p", min_p, (torch.float32,)),
                                ("top_k", top_k, INDEX_DTYPES),
                                ("top_p", top_p, (torch.float32,))):
        if value is not None:
            require_tensor(name, value, ndim=1, dtypes=dtypes, same_device_as=on, shape=states)
    if validate:
        if min_p is not None and not bool(((min_p >= 0) & (min_p <= 1)).all()):
            raise ValueError("min_p must be in [0, 1]")
        if top_p is not None and not bool(((top_p > 0) & (top_p <= 1)).all()):
            raise ValueError("top_p must be in (0, 1]")
    return _Fold(min_p=min_p, top_k=top_k, top_p=top_p)


def _check_contents(
    cu: torch.Tensor,
    drafts: torch.Tensor,
    pos: torch.Tensor,
    idx_mapping: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    expanded_local_pos: torch.Tensor,
    temperature: torch.Tensor,
    draft_logits: torch.Tensor | None,
    *,
    num_logits: int,
    vocab: int,
    steps: int,
) -> None:
    """The checks that read tensor contents (one device sync each)."""
    cu = cu.to(torch.int64).cpu()
    counts = torch.diff(cu)
    if int(cu[0]) != 0 or bool((counts < 1).any()):
        raise ValueError(
            "cu_num_logits must start at 0 and grow by at least 1 per request (its bonus row)"
        )
    if int(cu[-1]) != num_logits:
        raise ValueError(
            f"cu_num_logits[-1] = {int(cu[-1])} must equal the number of logits rows "
            f"({num_logits})"
        )
    if int(counts.max()) > steps + 1:
        raise ValueError(
            f"cu_num_logits: a request has {int(counts.max()) - 1} drafts, more than "
            f"num_speculative_steps = {steps}"
        )
    states = idx_mapping.to(torch.int64).cpu()
    if bool((states < 0).any()) or bool((states >= temperature.shape[0]).any()):
        raise ValueError(
            f"idx_mapping must index temperature and seed (0 <= state < "
            f"{temperature.shape[0]})"
        )
    if draft_logits is not None and bool((states >= draft_logits.shape[0]).any()):
        raise ValueError(
            f"idx_mapping must index draft_logits (dim 0 is {draft_logits.shape[0]})"
        )
    expected_states = torch.repeat_interleave(states, counts)
    if not torch.equal(expanded_idx_mapping.to(torch.int64).cpu(), expected_states):
        raise ValueError("expanded_idx_mapping must repeat idx_mapping over each request's rows")
    starts = torch.repeat_interleave(cu[:-1], counts)
    local = torch.arange(num_logits, dtype=torch.int64) - starts
    if not torch.equal(expanded_local_pos.to(torch.int64).cpu(), local):
        raise ValueError("expanded_local_pos must count each request's rows from 0")
    check_token_ids({"draft_sampled": drafts}, vocab=vocab, padding=("draft_sampled",))
    if bool((pos.to(torch.int64).cpu() < 0).any()):
        raise ValueError("pos must be non-negative")
    temps = temperature.cpu()
    if not bool(torch.isfinite(temps).all()) or bool((temps < 0).any()):
        raise ValueError("temperature must be finite and non-negative")
