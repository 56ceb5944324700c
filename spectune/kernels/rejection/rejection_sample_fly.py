"""V1 verification under either vLLM release's semantics, with vLLM 0.33's FLy windows.

:func:`rejection_sample` is the public launcher (:func:`spectune.kernels.rejection_sample`):
the arguments of :func:`spectune.kernels.rejection.rejection_sample.rejection_sample`, the
FLy arguments vLLM 0.33's V1 ``rejection_sample`` takes (``fly_window_size``,
``fly_entropy_threshold``, ``fly_entropy_top_k``) and ``vllm_version=`` ("0.32" or
"0.33"; ``None``: the installed vLLM's, else the newest supported). Without a FLy window
both releases verify alike (0.33 only computes the target probabilities once for its
greedy and random paths), so those calls run the 0.32 launcher untouched: its kernels,
its launches, its source hash.

FLy (``vllm/v1/spec_decode/fly.py``, vLLM 0.33): a draft the native test rejects is
accepted anyway ("deferred") when

* the draft is a token (in ``[0, V)``);
* its row's top-``k`` entropy ``-sum p log p`` over the ``k = fly_entropy_top_k`` largest
  target probabilities is at least ``fly_entropy_threshold``;
* at least ``W = fly_window_size`` drafts follow it in its request, and the native test
  accepts each of the next ``W``;
* greedy requests: the target logit of the draft is finite; random requests: the draft
  probability (1 without draft probabilities) and the target probability of the draft
  are positive.

The decisions read only the native decisions, never each other's (vLLM's pre-pass reads
each later row before it overrides it), so a deferral is a function of the row and the
``W`` rows after it. A deferred draft is emitted as an accepted one; every other row
emits what the native verification emits there.

How: the 0.32 kernels run as they do without FLy (their row passes, their acceptance
tests), then two launches replace the chain walk:

* ``_fly_stats_kernel``, one program per row and split (the launch config's ``SPLITS``):
  for rows that may defer (natively rejected, the draft a token with the conditions
  above that need no entropy, a window's worth of drafts after it), one pass over the
  split's chunk: the fixed-point softmax denominator (the native kernels' sum, term for
  term) and the chunk's ``k`` largest values;
* ``_fly_finalize_kernel``, one program per request: the native decisions of its rows,
  then the chain walk with deferrals (the entropy from the partials: the ``k`` largest
  of the chunks' candidates, each ``p = exp(x - max) / denominator`` as the native
  kernels compute it).

Exactness: the window and the conditions are integer and sign tests on the native
kernels' own values, so they are vLLM's decisions; the entropy uses the kernels'
probabilities, which differ from torch's float32 softmax by a few ulps (as every V1
decision does, see :mod:`spectune.kernels.rejection.rejection_sample_ref`): a deferral
can differ only where the entropy lies within :data:`NEAR_TIE_RTOL` of the threshold
(relative to ``1 + entropy``, how far a relative change of the probabilities moves it),
which the reference flags as a near-tie.

Not part of the ``rejection_sample`` family's source hash (its tuned rows are
measurements of the 0.32 launch, which FLy runs unchanged with the same config).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from spectune.kernels._folding import load_folded
from spectune.kernels._launch import launch_config
from spectune.kernels._reductions import argmax_of_parts, first_max_of_parts, split_row
from spectune.kernels._truncation import ROUNDED_DIV
from spectune.kernels._vllm_version import resolve_vllm_version
from spectune.kernels.rejection.rejection_sample import (
    _Args,
    _check_inputs,
    _fold_rows,
    _fused_row_kernel,
    _has_softmax,
    _inv_denominator,
    _request_of_row,
    _row_fold_max,
    _row_max_from_parts,
    _split_max_kernel,
    _split_recover_kernel,
    _split_sum_kernel,
)
from spectune.kernels.rejection.rejection_sample import (
    rejection_sample as _rejection_sample_032,
)
from spectune.kernels.rejection.rejection_sample_constants import (
    FIXED_POINT_BITS,
    PLACEHOLDER_TOKEN_ID,
)
from spectune.kernels.rejection.rejection_sample_space import (
    FOLDED,
    default_config,
    problem_for,
    search_space,
)

__all__ = ["FlyWindow", "check_fly", "rejection_sample"]

# The chain walk touches k + 1 scalars per request: one warp is plenty, on any GPU.
_FINALIZE_NUM_WARPS = 1


class FlyWindow(NamedTuple):
    """A FLy call's parameters, checked (see :func:`check_fly`)."""

    window: int
    threshold: float
    top_k: int


def check_fly(
    fly_window_size: int | None, fly_entropy_threshold: float | None, fly_entropy_top_k: int,
    *, vllm_version: str,
) -> FlyWindow | None:
    """The FLy parameters of a call, checked; ``None`` when FLy is off (no window).

    As vLLM 0.33: FLy is on when ``fly_window_size`` is given; it needs a threshold and a
    positive ``fly_entropy_top_k``.

    Raises:
        ValueError: naming the offending argument.
    """
    if fly_window_size is None:
        return None
    if vllm_version == "0.32":
        raise ValueError("fly_window_size: FLy verification is vLLM 0.33's; "
                         "vllm_version='0.32' has none")
    if isinstance(fly_window_size, bool) or not isinstance(fly_window_size, int) or (
        fly_window_size < 0
    ):
        raise ValueError(f"fly_window_size must be a non-negative int, got {fly_window_size!r}")
    if fly_entropy_threshold is None:
        raise ValueError("fly_entropy_threshold is required with fly_window_size")
    threshold = float(fly_entropy_threshold)
    if threshold != threshold:
        raise ValueError("fly_entropy_threshold must not be NaN")
    if isinstance(fly_entropy_top_k, bool) or not isinstance(fly_entropy_top_k, int) or (
        fly_entropy_top_k <= 0
    ):
        raise ValueError(f"fly_entropy_top_k must be a positive int, got {fly_entropy_top_k!r}")
    return FlyWindow(fly_window_size, threshold, fly_entropy_top_k)


# --------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------


@triton.jit
def _insert_largest(x, top, offs, slots, TOP_K: tl.constexpr, BLOCK_V: tl.constexpr,
                    BLOCK_TOP: tl.constexpr):
    """``top`` (the ``TOP_K`` largest values seen, any order; slots past ``TOP_K`` hold
    +inf and are never replaced) updated with the tile ``x``: each of the tile's
    ``TOP_K`` largest values, one occurrence at a time, replaces the smallest kept value
    when larger (a multiset: equal values each take a slot)."""
    for _ in tl.static_range(TOP_K):
        largest = tl.max(x, axis=0)
        smallest = tl.min(top, axis=0)
        take = largest > smallest
        # The lane and slot it moves between (none when it is not taken).
        lane = tl.where(take, tl.min(tl.where(x == largest, offs, BLOCK_V), axis=0), BLOCK_V)
        x = tl.where(offs == lane, float("-inf"), x)
        slot = tl.where(take, tl.min(tl.where(top == smallest, slots, BLOCK_TOP), axis=0),
                        BLOCK_TOP)
        top = tl.where(slots == slot, largest, top)
    return top


@triton.jit
def _fly_may_defer(
    x_ptr, dp_ptr, draft_ptr, cu_ptr, greedy_ptr, part_max_ptr, part_arg_ptr, accept_ptr,
    fold_temp_ptr, fold_min_ptr, fold_key_ptr, row, vocab, batch, window,
    SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_B: tl.constexpr,
    ALL_GREEDY: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, FOLD: tl.constexpr,
):
    """Whether ``row`` may defer, as far as it can be told without the entropy and the
    next rows' decisions: its draft is rejected natively and is a token with a finite
    target logit (greedy) or a positive draft probability (random), its row has a
    softmax, and ``window`` drafts follow it. Also its fold parameters and max."""
    req, start = _request_of_row(row, cu_ptr, batch, BLOCK_B)
    end = tl.load(cu_ptr + req).to(tl.int64)
    if ALL_GREEDY:
        greedy = True
    else:
        greedy = tl.load(greedy_ptr + req) != 0
    temp, min_value, threshold, row_max = _row_fold_max(
        fold_temp_ptr, fold_min_ptr, fold_key_ptr, row,
        _row_max_from_parts(part_max_ptr, row, SPLITS, BLOCK_S), FOLD,
    )
    draft = tl.load(draft_ptr + row).to(tl.int64)
    valid = (draft >= 0) & (draft < vocab)
    safe_d = tl.where(valid, draft, 0)
    if greedy:
        argmax = first_max_of_parts(part_max_ptr, part_arg_ptr, row, SPLITS, BLOCK_S)
        x_d = load_folded(x_ptr + row * vocab + safe_d, True, temp, min_value, threshold, FOLD)
        possible = (draft != argmax) & (x_d > float("-inf"))
    else:
        if HAS_DRAFT_PROBS:
            dp_d = tl.load(dp_ptr + row * vocab + safe_d).to(tl.float32)
        else:
            dp_d = tl.full((), 1.0, tl.float32)
        possible = (tl.load(accept_ptr + row) == 0) & (dp_d > 0)
    possible = possible & valid & _has_softmax(row_max) & (row - start + window < end - start)
    return possible, temp, min_value, threshold, row_max


@triton.jit
def _fly_stats_kernel(
    x_ptr, dp_ptr, draft_ptr, cu_ptr, greedy_ptr, part_max_ptr, part_arg_ptr, accept_ptr,
    fold_temp_ptr, fold_min_ptr, fold_key_ptr, fly_sum_ptr, fly_top_ptr, fly_cand_ptr,
    vocab, batch, n_tiles, chunk, window,
    SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_B: tl.constexpr,
    FRAC: tl.constexpr, TOP_K: tl.constexpr, BLOCK_TOP: tl.constexpr,
    ALL_GREEDY: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, FOLD: tl.constexpr,
):
    """A row's chunk, for a row that may defer: its fixed-point softmax denominator
    (the native kernels' terms) and its ``TOP_K`` largest values."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // SPLITS
    split = pid % SPLITS
    possible, temp, min_value, threshold, row_max = _fly_may_defer(
        x_ptr, dp_ptr, draft_ptr, cu_ptr, greedy_ptr, part_max_ptr, part_arg_ptr, accept_ptr,
        fold_temp_ptr, fold_min_ptr, fold_key_ptr, row, vocab, batch, window,
        SPLITS, BLOCK_S, BLOCK_B, ALL_GREEDY, HAS_DRAFT_PROBS, FOLD,
    )
    if split == 0:
        tl.store(fly_cand_ptr + row, possible.to(tl.int8))
    if possible:
        offs = tl.arange(0, BLOCK_V)
        slots = tl.arange(0, BLOCK_TOP)
        top = tl.where(slots < TOP_K, float("-inf"), float("inf"))
        acc = tl.zeros((), tl.int64)
        lo = split * chunk
        for t in range(n_tiles):
            idx = lo + t * BLOCK_V + offs
            x = load_folded(x_ptr + row * vocab + idx, idx < vocab, temp, min_value,
                            threshold, FOLD)
            # The native kernels' term: e in [0, 1], exact in float64, rounded.
            e = tl.exp(x - row_max)
            acc += tl.sum((e.to(tl.float64) * (2.0**FRAC) + 0.5).to(tl.int64), axis=0)
            if tl.max(x, axis=0) > tl.min(top, axis=0):
                top = _insert_largest(x, top, offs, slots, TOP_K, BLOCK_V, BLOCK_TOP)
        tl.store(fly_sum_ptr + pid, acc)
        tl.store(fly_top_ptr + pid * BLOCK_TOP + slots, top, mask=slots < TOP_K)


@triton.jit
def _fly_entropy(fly_sum_ptr, fly_top_ptr, row, row_max, SPLITS: tl.constexpr,
                 BLOCK_S: tl.constexpr, FRAC: tl.constexpr, TOP_K: tl.constexpr,
                 BLOCK_TOP: tl.constexpr):
    """The row's top-``TOP_K`` entropy ``-sum p log p`` (largest ``p`` first, a zero
    ``p`` adding 0, as vLLM's ``compute_fly_entropy``) and ``1 / denominator``."""
    s = tl.arange(0, BLOCK_S)
    sums = tl.load(fly_sum_ptr + row * SPLITS + s, mask=s < SPLITS, other=0)
    inv_den = _inv_denominator(tl.sum(sums, axis=0), FRAC)
    slots = tl.arange(0, BLOCK_TOP)
    flat = s[:, None] * BLOCK_TOP + slots[None, :]
    cands = tl.load(fly_top_ptr + row * SPLITS * BLOCK_TOP + flat,
                    mask=(s[:, None] < SPLITS) & (slots[None, :] < TOP_K),
                    other=float("-inf"))
    total = tl.zeros((), tl.float32)
    for _ in tl.static_range(TOP_K):
        largest = tl.max(tl.max(cands, axis=1), axis=0)
        first = tl.min(tl.min(tl.where(cands == largest, flat, BLOCK_S * BLOCK_TOP), axis=1),
                       axis=0)
        cands = tl.where(flat == first, float("-inf"), cands)
        p = tl.exp(largest - row_max) * inv_den
        total += tl.where(p > 0.0, p * tl.log(p), 0.0)
    return -total, inv_den


@triton.jit
def _fly_finalize_kernel(
    out_ptr, x_ptr, draft_ptr, cu_ptr, bonus_ptr, greedy_ptr,
    part_max_ptr, part_arg_ptr, part_score_ptr, part_idx_ptr, accept_ptr,
    fold_temp_ptr, fold_min_ptr, fold_key_ptr, fly_sum_ptr, fly_top_ptr, fly_cand_ptr,
    vocab, max_spec_len, window, entropy_threshold,
    SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr, FRAC: tl.constexpr,
    TOP_K: tl.constexpr, BLOCK_TOP: tl.constexpr, ALL_GREEDY: tl.constexpr,
    FOLD: tl.constexpr,
):
    """One program per request: the native decisions of its rows, then the chain walk
    with FLy's deferrals; tokens, placeholders after the first rejection."""
    req = tl.program_id(0).to(tl.int64)
    start = tl.load(cu_ptr + req - 1, mask=req > 0, other=0).to(tl.int64)
    end = tl.load(cu_ptr + req).to(tl.int64)
    n = end - start
    if ALL_GREEDY:
        greedy = True
    else:
        greedy = tl.load(greedy_ptr + req) != 0
    offs = tl.arange(0, BLOCK_K)
    native = tl.zeros((BLOCK_K,), tl.int32)
    for pos in range(n):
        row = start + pos
        draft = tl.load(draft_ptr + row).to(tl.int32)
        if greedy:
            accepted = draft == first_max_of_parts(part_max_ptr, part_arg_ptr, row, SPLITS,
                                                   BLOCK_S)
        else:
            accepted = tl.load(accept_ptr + row) != 0
        native = tl.where(offs == pos, accepted.to(tl.int32), native)
    tokens = tl.full((BLOCK_K,), PLACEHOLDER_TOKEN_ID, tl.int32)
    rejected = False
    for pos in range(n):
        if not rejected:
            row = start + pos
            draft = tl.load(draft_ptr + row).to(tl.int32)
            accepted = tl.sum(tl.where(offs == pos, native, 0), axis=0) != 0
            if greedy:
                token = first_max_of_parts(part_max_ptr, part_arg_ptr, row, SPLITS, BLOCK_S)
            else:
                token = draft
            if not accepted:
                # Tensors, not Python literals, where branches assign: one type each.
                deferred = tl.full((), 0, tl.int1)
                if tl.load(fly_cand_ptr + row) != 0:
                    # The next `window` drafts (all there: a candidate has them) pass
                    # the native test.
                    ahead = (offs > pos) & (offs <= pos + window) & (native == 0)
                    if tl.sum(ahead.to(tl.int32), axis=0) == 0:
                        temp, min_value, threshold, row_max = _row_fold_max(
                            fold_temp_ptr, fold_min_ptr, fold_key_ptr, row,
                            _row_max_from_parts(part_max_ptr, row, SPLITS, BLOCK_S), FOLD,
                        )
                        entropy, inv_den = _fly_entropy(
                            fly_sum_ptr, fly_top_ptr, row, row_max, SPLITS, BLOCK_S, FRAC,
                            TOP_K, BLOCK_TOP,
                        )
                        deferred = entropy >= entropy_threshold
                        if not greedy:
                            # vLLM's test: the target probability of the draft is > 0.
                            x_d = load_folded(x_ptr + row * vocab + draft, True, temp,
                                              min_value, threshold, FOLD)
                            deferred = deferred & (tl.exp(x_d - row_max) * inv_den > 0.0)
                if not greedy:
                    # Written by the row kernels for every natively rejected row.
                    token = argmax_of_parts(part_score_ptr, part_idx_ptr, row, SPLITS, BLOCK_S)
                token = tl.where(deferred, draft, token)
                accepted = deferred
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
    fly_window_size: int | None = None,
    fly_entropy_threshold: float | None = None,
    fly_entropy_top_k: int = 3,
    vllm_version: str | None = None,
    config: Mapping[str, int] | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Verify speculative drafts against target logits; vLLM V1 semantics, 0.32's or 0.33's.

    The arguments up to ``min_p``, ``config`` and ``validate`` are those of vLLM 0.32's
    semantics (:func:`spectune.kernels.rejection.rejection_sample.rejection_sample`, which
    documents them and the tokens); without a FLy window both releases give those tokens.

    Args:
        fly_window_size: vLLM 0.33's FLy: how many drafts after a rejected one must pass
            the native test for it to be deferred (accepted); ``None`` turns FLy off.
        fly_entropy_threshold: The top-``k`` entropy (nats) a row needs for a deferral;
            required with ``fly_window_size``.
        fly_entropy_top_k: ``k`` of that entropy (vLLM's default 3); capped at ``V``.
        vllm_version: "0.32" or "0.33": whose semantics; ``None``: the installed vLLM's
            (else the newest supported). FLy needs "0.33".

    Returns:
        ``[B, max_spec_len + 1]`` int32 tokens, ``PLACEHOLDER_TOKEN_ID`` (-1) where
        nothing was emitted.

    Raises:
        ValueError: naming the offending argument, before any launch.
    """
    version = resolve_vllm_version(vllm_version)
    fly = check_fly(fly_window_size, fly_entropy_threshold, fly_entropy_top_k,
                    vllm_version=version)
    if fly is None:
        return _rejection_sample_032(
            draft_token_ids, cu_num_draft_tokens, target_logits, bonus_token_ids,
            max_spec_len=max_spec_len, draft_probs=draft_probs, is_greedy=is_greedy,
            uniform_probs=uniform_probs, inv_q=inv_q, seeds=seeds, temperature=temperature,
            top_k=top_k, top_p=top_p, min_p=min_p, config=config, validate=validate,
        )
    args = _check_inputs(
        draft_token_ids, cu_num_draft_tokens, target_logits, bonus_token_ids,
        max_spec_len=max_spec_len, draft_probs=draft_probs, is_greedy=is_greedy,
        uniform_probs=uniform_probs, inv_q=inv_q, seeds=seeds, temperature=temperature,
        top_k=top_k, top_p=top_p, min_p=min_p, validate=validate,
    )
    n_rows, vocab = target_logits.shape
    batch = cu_num_draft_tokens.shape[0]
    space = FOLDED if args.fold is not None else None
    config, launch_opts = launch_config(
        config, target_logits.device,
        search_space=search_space if space is None else space.search_space,
        default_config=default_config if space is None else space.default_config,
        problem=lambda: problem_for(
            max_spec_len=max_spec_len, batch=batch, vocab=vocab, dtype=target_logits.dtype,
            draft_probs=draft_probs is not None,
        ),
    )
    return _launch_fly(
        args, fly, n_rows=n_rows, vocab=vocab, batch=batch, max_spec_len=max_spec_len,
        config=config, launch_opts=launch_opts,
    )


def _launch_fly(
    args: _Args, fly: FlyWindow, *, n_rows: int, vocab: int, batch: int, max_spec_len: int,
    config: Mapping[str, int], launch_opts: dict[str, Any],
) -> torch.Tensor:
    """The 0.32 launches up to the chain walk (the same buffers and kernels), then
    FLy's statistics and chain walk."""
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
    greedy = args.is_greedy if args.is_greedy is not None else accept
    dp = args.draft_probs if args.draft_probs is not None else part_max
    u = args.uniform_probs if args.uniform_probs is not None else part_max
    q = args.inv_q if args.inv_q is not None else part_max
    seeds = args.seeds if args.seeds is not None else part_arg
    tl_score = tl.float64 if score_dtype == torch.float64 else tl.float32
    block_b = triton.next_power_of_2(batch)
    block_s = triton.next_power_of_2(splits)
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
            vocab, batch, tiles_per_split,
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

    top_k = min(fly.top_k, vocab)
    block_top = triton.next_power_of_2(top_k)
    fly_sum = torch.empty(parts, dtype=torch.int64, device=device)
    fly_top = torch.empty(parts * block_top, dtype=torch.float32, device=device)
    fly_cand = torch.zeros(max(n_rows, 1), dtype=torch.int8, device=device)
    fly_flags = {"TOP_K": top_k, "BLOCK_TOP": block_top, "ALL_GREEDY": all_greedy,
                 "FOLD": fold}
    if n_rows > 0:
        _fly_stats_kernel[(n_rows * splits,)](
            args.logits, dp, args.draft, args.cu, greedy, part_max, part_arg, accept,
            *fold_ptrs, fly_sum, fly_top, fly_cand,
            vocab, batch, tiles_per_split, chunk, fly.window,
            SPLITS=splits, BLOCK_S=block_s, BLOCK_V=block_v, BLOCK_B=block_b,
            FRAC=FIXED_POINT_BITS, HAS_DRAFT_PROBS=args.draft_probs is not None,
            **fly_flags, **launch_opts,
        )
    _fly_finalize_kernel[(batch,)](
        out, args.logits, args.draft, args.cu, args.bonus, greedy,
        part_max, part_arg, part_score, part_idx, accept, *fold_ptrs, fly_sum, fly_top,
        fly_cand, vocab, max_spec_len, fly.window, fly.threshold,
        SPLITS=splits, BLOCK_S=block_s, BLOCK_K=triton.next_power_of_2(max_spec_len + 1),
        FRAC=FIXED_POINT_BITS, **fly_flags, num_warps=_FINALIZE_NUM_WARPS,
    )
    return out
