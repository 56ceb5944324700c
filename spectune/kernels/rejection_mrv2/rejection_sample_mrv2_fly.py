"""MRV2 verification under either vLLM release's semantics, with vLLM 0.33's FLy windows.

:func:`rejection_sample_mrv2` is the public launcher
(:func:`spectune.kernels.rejection_sample_mrv2`): it takes every argument vLLM's MRV2
``rejection_sample`` takes (0.32's and 0.33's) and
``vllm_version=`` ("0.32" or "0.33"; ``None``: the installed vLLM's). Both releases verify
alike without FLy windows (0.33 finds a request's bonus row by position, 0.32 by step;
spectune's kernels read the rows off ``cu_num_logits``, which is both), so those calls run
the kernels of :mod:`spectune.kernels.rejection_mrv2.rejection_sample_mrv2` untouched.

FLy (``fly_window_size = W > 0``, vLLM 0.33, ``vllm/v1/spec_decode/fly.py`` and the
``FLY_WINDOW_SIZE`` branch of ``_rejection_kernel``): a draft the native test rejects is
accepted anyway when its row's target distribution is uncertain (the top-``k`` entropy
of the target logits at least ``fly_entropy_threshold``), the draft has positive target
(and draft) probability, at least ``W`` drafts follow it, and the next ``W`` drafts all
pass the native test; the chain then goes on after them. A deferral that fails stops
the chain at the deferred row, which emits what a native rejection there emits (the
target argmax, or a draw from the residual). A placeholder is never accepted or
deferred.

Exact: the native decisions are those of the unchanged kernels (group statistics, the
same coin and test); the entropy is computed with the very PyTorch operations vLLM
applies (:func:`fly_entropy`), so it is vLLM's float for float on the same device; the
window walk compares integers. Three launches, as without FLy: the statistics pass
(the unchanged kernel), *decide* (one program per request and split: the window walk
over the request's rows from their statistics, then, for a random request, the
Gumbel-max argmax of its stop row's residual over the split's chunk), *chain* (one
program per request: the tokens and the count). The launch config is the family's
(``BLOCK_V`` for the statistics, ``BLOCK_R`` and ``SPLITS`` for the draw), tuned as
without FLy.

With ``apply_sampling_params`` and a FLy window the processed target rows are written
(the entropy needs every processed logit, as vLLM's does): one pass writes what the fold
loads (:mod:`spectune.kernels._folding`), then the unfolded passes run on it. Greedy
rows are written unprocessed (the fold never processes them; vLLM's sampling parameters
of a greedy request never truncate).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
import triton
import triton.language as tl

from spectune.kernels._counter_rng import gumbel_noise
from spectune.kernels._folding import fold_rows, load_folded, row_fold
from spectune.kernels._launch import launch_config
from spectune.kernels._reductions import first_max, first_max_of_parts, later_wins, split_row
from spectune.kernels._truncation import TRITON_DIV
from spectune.kernels._vllm_version import resolve_vllm_version
from spectune.kernels.rejection.rejection_sample_constants import FIXED_POINT_BITS
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2 import (
    _accepts,
    _Args,
    _check_inputs,
    _log1m,
    _log_normaliser,
    _stats_kernel,
)
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2 import (
    rejection_sample_mrv2 as _verify_without_windows,
)
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_constants import (
    GROUP,
    PLACEHOLDER_TOKEN_ID,
)
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_space import FOLDED as _folded_space
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_space import (
    default_config,
    problem_for,
    search_space,
)

__all__ = ["fly_entropy", "rejection_sample_mrv2"]

# The chain touches k + 1 scalars per request: one warp is plenty, on any GPU.
_CHAIN_NUM_WARPS = 1


def fly_entropy(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """``[N]`` float32 entropy of each row's ``top_k`` most likely tokens, FLy's measure
    of uncertainty: ``-sum(p log p)`` over them, ``p`` the row's softmax.

    The operations (and their order) are vLLM's ``compute_fly_entropy(..., from_logits=
    True)``, so the floats are its floats on the same device.
    """
    values = logits.to(torch.float32)
    top = torch.topk(values, k=min(top_k, values.shape[-1]), dim=-1).values
    top_log_probs = top - values.logsumexp(dim=-1, keepdim=True)
    top_probs = top_log_probs.exp()
    terms = torch.where(top_probs > 0, top_probs * top_log_probs, torch.zeros_like(top_probs))
    return -terms.sum(dim=-1)


# --------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------


@triton.jit
def _processed_rows_kernel(
    x_ptr, x_stride, out_ptr, fold_temp_ptr, fold_min_ptr, fold_key_ptr, vocab, n_tiles,
    BLOCK_V: tl.constexpr, FOLD: tl.constexpr,
):
    """One row of the processed target logits (float32, contiguous): what the fold loads."""
    row = tl.program_id(0).to(tl.int64)
    f_temp, f_min, f_key = row_fold(fold_temp_ptr, fold_min_ptr, fold_key_ptr, row, FOLD)
    offs = tl.arange(0, BLOCK_V)
    for t in range(n_tiles):
        idx = t * BLOCK_V + offs
        in_vocab = idx < vocab
        x = load_folded(x_ptr + row * x_stride + idx, in_vocab, f_temp, f_min, f_key, FOLD)
        tl.store(out_ptr + row * vocab + idx, x, mask=in_vocab)


@triton.jit
def _fly_decide_kernel(
    t_ptr, t_stride, d_ptr, d_stride0, d_stride1, drafts_ptr, cu_ptr, idx_map_ptr, temp_ptr,
    seed_ptr, pos_ptr, entropy_ptr, t_gmax_ptr, t_gsum_ptr, d_gmax_ptr, d_gsum_ptr,
    part_max_ptr, part_arg_ptr, accepted_ptr, part_score_ptr, part_idx_ptr,
    vocab, n_groups, n_tiles, chunk, window, threshold,
    STEPS: tl.constexpr, SPLITS_V: tl.constexpr, BLOCK_SV: tl.constexpr,
    SPLITS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr, FRAC: tl.constexpr,
    HAS_DRAFT_LOGITS: tl.constexpr, USE_FP64: tl.constexpr,
):
    """One program per request and split: the FLy walk over the request's drafts (split 0
    stores how many are accepted); for a random request, the Gumbel-max argmax of the
    row where its chain stops over the split's chunk."""
    pid = tl.program_id(0).to(tl.int64)
    req = pid // SPLITS
    split = pid % SPLITS
    start = tl.load(cu_ptr + req).to(tl.int64)
    n_drafts = tl.load(cu_ptr + req + 1).to(tl.int64) - start - 1
    state = tl.load(idx_map_ptr + req).to(tl.int64)
    temp = tl.load(temp_ptr + state).to(tl.float32)
    # A greedy request draws nothing: its other splits have nothing to do.
    if (temp != 0.0) | (split == 0):
        seed = tl.load(seed_ptr + state)
        accepted_len = tl.zeros((), tl.int64)
        # The deferred row while a window is open, else -1.
        pending = tl.full((), -1, tl.int64)
        verifying = tl.full((), 1, tl.int1)
        for i in range(n_drafts):
            if verifying:
                row = start + i
                draft = tl.load(drafts_ptr + row + 1).to(tl.int64)
                # An id outside [0, V) (refused unless validate=False) is a placeholder.
                valid = (draft >= 0) & (draft < vocab)
                safe = tl.where(valid, draft, 0)
                accepted = tl.full((), 0, tl.int1)
                can_defer = tl.full((), 0, tl.int1)
                if temp == 0.0:
                    token = first_max_of_parts(
                        part_max_ptr, part_arg_ptr, row, SPLITS_V, BLOCK_SV
                    ).to(tl.int64)
                    accepted = valid & (token == draft)
                    t_logit = tl.load(t_ptr + row * t_stride + safe).to(tl.float32)
                    can_defer = valid & (t_logit > float("-inf"))
                elif valid:
                    accepted, t_lse, d_lse = _accepts(
                        t_ptr, t_stride, d_ptr, d_stride0, d_stride1, t_gmax_ptr, t_gsum_ptr,
                        d_gmax_ptr, d_gsum_ptr, t_gmax_ptr, t_gmax_ptr, t_gsum_ptr, row, i,
                        safe, state, temp, seed, tl.load(pos_ptr + row), n_groups,
                        BLOCK_G, FRAC, HAS_DRAFT_LOGITS, 0,
                    )
                    # The same floats the test used: both probabilities must be positive.
                    t_logp = tl.load(t_ptr + row * t_stride + safe).to(tl.float32) - t_lse
                    d_logp = tl.zeros((), tl.float32)
                    if HAS_DRAFT_LOGITS:
                        d_row = d_ptr + state * d_stride0 + i * d_stride1
                        d_logp = tl.load(d_row + safe).to(tl.float32) / temp - d_lse
                    can_defer = (t_logp > float("-inf")) & (d_logp > float("-inf"))
                if pending >= 0:
                    # Inside a window only native acceptances count; the last one
                    # confirms the deferred draft and the window.
                    verifying = accepted
                    if accepted & (i - pending == window):
                        accepted_len = tl.zeros((), tl.int64) + i + 1
                        pending = tl.full((), -1, tl.int64)
                elif accepted:
                    accepted_len = tl.zeros((), tl.int64) + i + 1
                else:
                    entropy = tl.load(entropy_ptr + row)
                    verifying = can_defer & (i + window < n_drafts) & (entropy >= threshold)
                    if verifying:
                        pending = tl.zeros((), tl.int64) + i
        if split == 0:
            tl.store(accepted_ptr + req, accepted_len.to(tl.int32))
        if temp != 0.0:
            # The stop row: a (deferred or not) rejected draft, a placeholder, or the
            # bonus row. Its residual, as where the chain stops without FLy.
            row = start + accepted_len
            is_draft_row = accepted_len < n_drafts
            # The bonus row has no draft (and the batch's last row no next id to read).
            draft = tl.load(drafts_ptr + tl.where(is_draft_row, row + 1, row)).to(tl.int64)
            draft = tl.where(is_draft_row, draft, -1)
            plain = (draft < 0) | (draft >= vocab)
            t_lse = tl.zeros((), tl.float32)
            d_lse = tl.zeros((), tl.float32)
            if (draft >= 0) & (draft < vocab):
                t_lse = _log_normaliser(
                    t_gmax_ptr + row * n_groups, t_gsum_ptr + row * n_groups, n_groups,
                    BLOCK_G, FRAC,
                )
                if HAS_DRAFT_LOGITS:
                    d_lse = _log_normaliser(
                        d_gmax_ptr + row * n_groups, d_gsum_ptr + row * n_groups, n_groups,
                        BLOCK_G, FRAC,
                    )
            pos = tl.load(pos_ptr + row)
            offs = tl.arange(0, BLOCK_R)
            lo = split * chunk
            best = tl.full((), float("-inf"), tl.float64 if USE_FP64 else tl.float32)
            best_idx = lo.to(tl.int32)
            for t in range(n_tiles):
                idx = lo + t * BLOCK_R + offs
                in_vocab = idx < vocab
                x = tl.load(t_ptr + row * t_stride + idx, mask=in_vocab,
                            other=float("-inf")).to(tl.float32)
                if HAS_DRAFT_LOGITS:
                    # A bonus row reads the last step's draft logits and ignores them.
                    d_step = tl.minimum(accepted_len, STEPS - 1)
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
                tile_best, tile_arg = first_max(score, BLOCK_R)
                # An earlier tile keeps a tie (lowest index).
                if later_wins(tile_best, best):
                    best = tile_best
                    best_idx = (lo + t * BLOCK_R + tile_arg).to(tl.int32)
            tl.store(part_score_ptr + pid, best)
            tl.store(part_idx_ptr + pid, best_idx)


@triton.jit
def _fly_chain_kernel(
    sampled_ptr, num_sampled_ptr, drafts_ptr, cu_ptr, idx_map_ptr, temp_ptr,
    part_max_ptr, part_arg_ptr, accepted_ptr, part_score_ptr, part_idx_ptr,
    STEPS: tl.constexpr, SPLITS_V: tl.constexpr, BLOCK_SV: tl.constexpr,
    SPLITS_R: tl.constexpr, BLOCK_SR: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One program per request: the accepted drafts, the stop row's token, the count."""
    req = tl.program_id(0).to(tl.int64)
    start = tl.load(cu_ptr + req).to(tl.int64)
    state = tl.load(idx_map_ptr + req).to(tl.int64)
    greedy = tl.load(temp_ptr + state).to(tl.float32) == 0.0
    accepted_len = tl.load(accepted_ptr + req).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    tokens = tl.load(drafts_ptr + start + 1 + offs, mask=offs < accepted_len,
                     other=PLACEHOLDER_TOKEN_ID).to(tl.int64)
    if greedy:
        token = first_max_of_parts(
            part_max_ptr, part_arg_ptr, start + accepted_len, SPLITS_V, BLOCK_SV
        )
    else:
        token = first_max_of_parts(part_score_ptr, part_idx_ptr, req, SPLITS_R, BLOCK_SR)
    tokens = tl.where(offs == accepted_len, token.to(tl.int64), tokens)
    tl.store(sampled_ptr + req * (STEPS + 1) + offs, tokens, mask=offs <= STEPS)
    tl.store(num_sampled_ptr + req, (accepted_len + 1).to(tl.int32))


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
    synthetic_conditional_rates: torch.Tensor | None = None,
    use_block_verification: bool = False,
    contexts: torch.Tensor | None = None,
    watermarking: torch.Tensor | None = None,
    watermarking_skip_mask: torch.Tensor | None = None,
    watermark_key: int | None = None,
    fly_window_size: int = 0,
    fly_entropy_threshold: float = 0.3,
    fly_entropy_top_k: int = 3,
    apply_sampling_params: bool = False,
    min_p: torch.Tensor | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    vllm_version: str | None = None,
    config: Mapping[str, int] | None = None,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify drafts against target logits; vLLM Model Runner V2 semantics (0.32 or 0.33).

    The positional arguments are vLLM's MRV2 ``rejection_sample``'s, but for
    ``use_fp64``, which is spectune's twelfth; vLLM's other arguments are keywords here.
    Block verification, synthetic acceptance rates and watermarking are not implemented
    (the vLLM router hands those calls to vLLM): only their defaults are taken.

    Args:
        target_logits: ``[num_logits, V]`` float32/bfloat16/float16, sampling parameters
            already applied, or raw with ``apply_sampling_params``; rows may be strided
            (last dim contiguous). Request ``i`` owns rows
            ``cu_num_logits[i]:cu_num_logits[i + 1]``: its drafts' rows, then its bonus
            row; requests may have different numbers of drafts.
        draft_logits: ``[max_num_reqs, k, V']`` drafter logits before temperature,
            indexed by request state and draft step (``V' >= V``), or ``None`` for
            drafters without logits (ngram).
        draft_sampled: ``[num_logits]`` int32/int64 in ``[0, V)``; ``draft_sampled[r + 1]``
            is the draft row ``r`` verifies; ``-1`` (only) is a placeholder, never
            accepted.
        cu_num_logits: ``[num_reqs + 1]`` int32/int64 row offsets, starting at 0.
        pos: ``[num_logits]`` int64 position of each row (the random streams' counter).
        idx_mapping: ``[num_reqs]`` request state of each request.
        expanded_idx_mapping: ``[num_logits]`` request state of each row.
        expanded_local_pos: ``[num_logits]`` step of each row within its request.
        temperature: ``[max_num_reqs]`` float32; 0 means greedy.
        seed: ``[max_num_reqs]`` int64 per-request seeds.
        num_speculative_steps: ``k``, the most drafts a request has.
        use_fp64: Gumbel-max in float64 (vLLM's ``use_fp64_gumbel``).
        synthetic_conditional_rates: Only ``None`` (synthetic acceptance: not implemented).
        use_block_verification: Only ``False`` (block verification: not implemented).
        contexts: Only ``None`` (watermarking: not implemented); so are
            ``watermarking``, ``watermarking_skip_mask`` and ``watermark_key``.
        watermarking: See ``contexts``.
        watermarking_skip_mask: See ``contexts``.
        watermark_key: See ``contexts``.
        fly_window_size: ``W``, FLy's window (vLLM 0.33): 0 turns FLy off; a rejected
            draft whose next ``W`` drafts pass natively may be accepted (see the module).
        fly_entropy_threshold: The least top-k entropy (nats) of the target row for a
            rejection to be deferred (compared in float32, as vLLM does).
        fly_entropy_top_k: How many of the row's likeliest tokens the entropy covers
            (positive).
        apply_sampling_params: Fold the sampling parameters into the verification: the
            target logits are raw, and each value read is processed as vLLM's
            ``Sampler.apply_sampling_params`` would (temperature, then ``min_p``, then
            ``top_k``/``top_p``), without writing the processed rows (but with FLy
            windows, whose entropy reads every processed logit).
        min_p: ``[max_num_reqs]`` float32 per request state in ``[0, 1]`` (0: none);
            only with ``apply_sampling_params``.
        top_k: ``[max_num_reqs]`` int32/int64 (``V`` or more, or below 1: none); only
            with ``apply_sampling_params``.
        top_p: ``[max_num_reqs]`` float32 in ``(0, 1]`` (1: none); only with
            ``apply_sampling_params``.
        vllm_version: Whose semantics: ``"0.32"`` (no FLy) or ``"0.33"``; ``None``, the
            installed vLLM's (:func:`spectune.kernels.vllm_semantics_version`).
        config: Launch configuration (see
            :func:`~spectune.kernels.rejection_mrv2.rejection_sample_mrv2_space.search_space`,
            and its ``FOLDED`` space with ``apply_sampling_params``); ``None`` uses the
            default config of the launch's problem.
        validate: Also check what needs the tensors' contents (row offsets, mappings,
            draft ids); callers that guarantee them (the vLLM router) pass ``False``: no
            device sync then, and a draft id outside ``[0, V)`` counts as a placeholder.

    Returns:
        ``(sampled, num_sampled)``: ``[num_reqs, k + 1]`` int64 tokens (``-1`` past each
        request's count) and ``[num_reqs]`` int32 counts (accepted drafts + 1).
        Non-finite logits give the defined tokens of
        :func:`~spectune.kernels.rejection_mrv2.rejection_sample_mrv2_reference`.

    Raises:
        ValueError: naming the offending argument, before any launch.
    """
    version = resolve_vllm_version(vllm_version)
    _refuse_unimplemented(
        synthetic_conditional_rates=synthetic_conditional_rates,
        use_block_verification=use_block_verification, contexts=contexts,
        watermarking=watermarking, watermarking_skip_mask=watermarking_skip_mask,
        watermark_key=watermark_key,
    )
    window = _fly_window(version, fly_window_size, fly_entropy_threshold, fly_entropy_top_k)
    if window == 0:
        return _verify_without_windows(
            target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
            expanded_idx_mapping, expanded_local_pos, temperature, seed,
            num_speculative_steps, use_fp64, apply_sampling_params=apply_sampling_params,
            min_p=min_p, top_k=top_k, top_p=top_p, config=config, validate=validate,
        )
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
    return _launch_fly(
        args, num_reqs=num_reqs, vocab=vocab, config=config, launch_opts=launch_opts,
        window=window, threshold=float(fly_entropy_threshold), entropy_top_k=fly_entropy_top_k,
    )


def _refuse_unimplemented(
    *, synthetic_conditional_rates: torch.Tensor | None, use_block_verification: bool,
    **watermarking: Any,
) -> None:
    """vLLM's options spectune does not implement: only their defaults are taken."""
    if synthetic_conditional_rates is not None:
        raise ValueError("synthetic_conditional_rates: synthetic acceptance is not "
                         "implemented (the vLLM router hands those calls to vLLM)")
    if use_block_verification is not False:
        raise ValueError("use_block_verification: block verification is not implemented "
                         "(the vLLM router hands those calls to vLLM)")
    for name, value in watermarking.items():
        if value is not None:
            raise ValueError(f"{name}: watermarking is not implemented (the vLLM router "
                             f"hands those calls to vLLM)")


def _fly_window(version: str, window: int, threshold: float, top_k: int) -> int:
    """The FLy window to apply (0: none), its arguments checked."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"fly_window_size must be a non-negative int, got {window!r}")
    if window == 0:
        return 0
    if version == "0.32":
        raise ValueError(
            f"fly_window_size = {window}: FLy windows are vLLM 0.33 semantics, not "
            f"vllm_version='0.32''s"
        )
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"fly_entropy_top_k must be a positive int, got {top_k!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise ValueError(f"fly_entropy_threshold must be a number, got {threshold!r}")
    return window


def _launch_fly(
    args: _Args, *, num_reqs: int, vocab: int, config: Mapping[str, int],
    launch_opts: dict[str, Any], window: int, threshold: float, entropy_top_k: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    device = args.target.device
    steps = args.steps
    sampled = torch.empty((num_reqs, steps + 1), dtype=torch.int64, device=device)
    num_sampled = torch.empty((num_reqs,), dtype=torch.int32, device=device)
    if num_reqs == 0:
        return sampled, num_sampled
    if args.fold is not None:
        args = replace(args, target=_processed_rows(args, vocab=vocab, config=config,
                                                    launch_opts=launch_opts), fold=None)
    target = args.target
    entropy = fly_entropy(target, entropy_top_k)
    # Every buffer's size follows from shapes alone: no device sync, nothing data-sized.
    rows = target.shape[0]
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
    part_score = torch.empty(num_reqs * splits_r, dtype=score_dtype, device=device)
    part_idx = torch.empty(num_reqs * splits_r, dtype=torch.int32, device=device)
    accepted = torch.empty(num_reqs, dtype=torch.int32, device=device)
    t_gmax = torch.empty(rows * n_groups, dtype=torch.float32, device=device)
    t_gsum = torch.empty(rows * n_groups, dtype=torch.int64, device=device)
    # With k = 0 every row is a bonus row: draft logits are never read.
    has_draft = args.draft is not None and steps > 0
    if has_draft:
        assert args.draft is not None
        d_gmax = torch.empty(rows * n_groups, dtype=torch.float32, device=device)
        d_gsum = torch.empty(rows * n_groups, dtype=torch.int64, device=device)
        draft, d_stride0, d_stride1 = args.draft, args.draft.stride(0), args.draft.stride(1)
    else:
        # Never read (HAS_DRAFT_LOGITS is a constexpr); any pointer stands in.
        d_gmax, d_gsum, draft, d_stride0, d_stride1 = t_gmax, t_gsum, target, 0, 0
    common = (target, target.stride(0), draft, d_stride0, d_stride1, args.drafts, args.cu,
              args.idx_mapping, args.temperature)
    _stats_kernel[(num_reqs * (steps + 1) * splits_v,)](
        *common, part_max, part_arg, t_gmax, t_gsum, d_gmax, d_gsum,
        part_max, part_max, part_arg,  # never read (FOLD is 0)
        vocab, n_groups, tiles_v, chunk_v,
        STEPS=steps, SPLITS=splits_v, BLOCK_V=block_v, FRAC=FIXED_POINT_BITS,
        HAS_DRAFT_LOGITS=has_draft, FOLD=0, **launch_opts,
    )
    _fly_decide_kernel[(num_reqs * splits_r,)](
        *common, args.seed, args.pos, entropy, t_gmax, t_gsum, d_gmax, d_gsum,
        part_max, part_arg, accepted, part_score, part_idx,
        vocab, n_groups, tiles_r, chunk_r, window, threshold,
        STEPS=steps, SPLITS_V=splits_v, BLOCK_SV=triton.next_power_of_2(splits_v),
        SPLITS=splits_r, BLOCK_R=block_r, BLOCK_G=triton.next_power_of_2(n_groups),
        FRAC=FIXED_POINT_BITS, HAS_DRAFT_LOGITS=has_draft, USE_FP64=args.use_fp64,
        **launch_opts,
    )
    _fly_chain_kernel[(num_reqs,)](
        sampled, num_sampled, args.drafts, args.cu, args.idx_mapping, args.temperature,
        part_max, part_arg, accepted, part_score, part_idx,
        STEPS=steps, SPLITS_V=splits_v, BLOCK_SV=triton.next_power_of_2(splits_v),
        SPLITS_R=splits_r, BLOCK_SR=triton.next_power_of_2(splits_r),
        BLOCK_K=triton.next_power_of_2(steps + 1), num_warps=_CHAIN_NUM_WARPS,
    )
    return sampled, num_sampled


def _processed_rows(
    args: _Args, *, vocab: int, config: Mapping[str, int], launch_opts: dict[str, Any]
) -> torch.Tensor:
    """``[N, V]`` float32: the target rows as vLLM's ``apply_sampling_params`` writes them
    (greedy rows unprocessed), from the fold's pre-pass."""
    assert args.fold is not None and args.expanded_idx_mapping is not None
    target = args.target
    rows = target.shape[0]
    folded = fold_rows(
        target, args.expanded_idx_mapping, args.temperature, min_p=args.fold.min_p,
        top_k=args.fold.top_k, top_p=args.fold.top_p, div=TRITON_DIV.value, config=config,
        launch_opts=launch_opts,
    )
    out = torch.empty((rows, vocab), dtype=torch.float32, device=target.device)
    block = min(config["BLOCK_V"], triton.next_power_of_2(vocab))
    _processed_rows_kernel[(rows,)](
        target, target.stride(0), out, folded.temp, folded.min_value, folded.threshold,
        vocab, triton.cdiv(vocab, block), BLOCK_V=block, FOLD=TRITON_DIV.value,
        **launch_opts,
    )
    return out
