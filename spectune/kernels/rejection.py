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

* the max and argmax are exact (first index on ties);
* the softmax denominator is accumulated in 42-bit fixed point in ``int64``, so its
  value does not depend on how the vocabulary is tiled or split (integer addition is
  associative); hence the probabilities, the acceptance test and the recovered
  token are bit-identical for every config;
* the recovered argmax takes the lowest index on ties;
* with ``seeds`` the random streams are indexed by (request seed, vocab index) or
  (request seed, draft position), never by tile or program.

Against vLLM (torch's float32 softmax) our probabilities differ by a few ulps, so a
decision can differ only where rounding decides a near-tie; see
:func:`decision_margins` and :data:`NEAR_TIE_RTOL`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from spectune.kernels._philox import philox
from spectune.space import Constraint, Param, Problem, SearchSpace

__all__ = [
    "FAMILY",
    "FIXED_POINT_BITS",
    "MAX_VOCAB",
    "NEAR_TIE_RTOL",
    "PLACEHOLDER_TOKEN_ID",
    "ReferenceResult",
    "RejectionInputs",
    "RejectionSampleFamily",
    "decision_margins_agree",
    "default_config",
    "draw_random_inputs",
    "rejection_sample",
    "rejection_sample_reference",
    "search_space",
]

PLACEHOLDER_TOKEN_ID = -1
#: Fractional bits of the fixed-point softmax denominator.
FIXED_POINT_BITS = 42
#: Largest vocabulary the fixed-point denominator cannot overflow: V * 2**42 < 2**63.
MAX_VOCAB = 2**21 - 1
#: Relative margin under which a decision counts as a near-tie that float rounding of
#: the softmax may decide either way (ours: fixed-point sum, torch: float32 tree sum).
NEAR_TIE_RTOL = 1e-5

# The chain walk touches k + 1 scalars per request: one warp is plenty, on any GPU.
_FINALIZE_NUM_WARPS = 1

_LOGITS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INDEX_DTYPES = (torch.int32, torch.int64)


# --------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------


@triton.jit
def _request_of_row(row, cu_ptr, batch, BLOCK_B: tl.constexpr):
    """Request index and its first row, for a draft row (searching cu_num_draft_tokens)."""
    offs = tl.arange(0, BLOCK_B)
    cu = tl.load(cu_ptr + offs, mask=offs < batch, other=2**31 - 1).to(tl.int64)
    req = tl.sum((cu <= row).to(tl.int32), axis=0)
    start = tl.load(cu_ptr + req - 1, mask=req > 0, other=0).to(tl.int64)
    return req, start


@triton.jit
def _chunk_max(x_ptr, lo, vocab, n_tiles, BLOCK_V: tl.constexpr):
    """Max of x[lo : lo + n_tiles * BLOCK_V] (clipped to vocab), first index on ties."""
    offs = tl.arange(0, BLOCK_V)
    best = tl.full((), float("-inf"), tl.float32)
    best_idx = lo.to(tl.int32)
    for t in range(n_tiles):
        idx = lo + t * BLOCK_V + offs
        x = tl.load(x_ptr + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
        tile_max, tile_arg = tl.max(x, axis=0, return_indices=True)
        # Strictly greater: an earlier tile keeps a tie (first index overall).
        if tile_max > best:
            best = tile_max
            best_idx = (lo + t * BLOCK_V + tile_arg).to(tl.int32)
    return best, best_idx


@triton.jit
def _chunk_sum_fixed(x_ptr, lo, vocab, n_tiles, row_max, BLOCK_V: tl.constexpr, FRAC: tl.constexpr):
    """Sum of exp(x - row_max) over a chunk, in fixed point with FRAC fractional bits."""
    offs = tl.arange(0, BLOCK_V)
    acc = tl.zeros((), tl.int64)
    for t in range(n_tiles):
        idx = lo + t * BLOCK_V + offs
        x = tl.load(x_ptr + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
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
    """A float64 uniform in (0, 1) from Philox(seed; pos, stream 1): 52 random bits."""
    c0 = pos.to(tl.uint32)
    z = c0 * 0
    a, b, _, _ = tl.philox(seed, c0, z + 1, z, z)
    bits = (a.to(tl.uint64) << 20) | (b >> 12).to(tl.uint64)
    return (bits.to(tl.float64) + 0.5) * (1.0 / 4503599627370496.0)


@triton.jit
def _inv_exponential(seed, idx):
    """1 / Exp(1) draws, float32, from Philox(seed; vocab index, stream 0)."""
    c0 = idx.to(tl.uint32)
    z = c0 * 0
    a, _, _, _ = tl.philox(seed, c0, z, z, z)
    # 23 bits plus one half: strictly inside (0, 1) and exact in float32.
    u = ((a >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    # An approximate log may round -log(u) to 0 for u next to 1: clamp to the smallest
    # normal so 0 * inv_q stays 0 (the draw keeps its meaning: a near-zero exponential).
    q = tl.maximum(-tl.log(u), 1.1754943508222875e-38)
    return 1.0 / q


@triton.jit
def _accept_draft(
    x_ptr, dp_ptr, row, req, pos, draft, row_max, inv_den, u_ptr, seed_ptr, vocab,
    HAS_DRAFT_PROBS: tl.constexpr, SEEDED: tl.constexpr,
):
    """vLLM's acceptance test for one random row: draft >= 0, dp(d) > 0, p(d)/dp(d) >= u."""
    safe_d = tl.maximum(draft, 0)
    x_d = tl.load(x_ptr + row * vocab + safe_d).to(tl.float32)
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
    return (draft >= 0) & (dp_d > 0) & (ratio >= u)


@triton.jit
def _chunk_recover(
    x_ptr, dp_ptr, q_ptr, seed_ptr, row, req, draft, lo, vocab, n_tiles, row_max, inv_den,
    BLOCK_V: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, SEEDED: tl.constexpr,
    SCORE_DTYPE: tl.constexpr,
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
        x = tl.load(x_ptr + row * vocab + idx, mask=in_vocab, other=float("-inf"))
        p = tl.exp(x.to(tl.float32) - row_max) * inv_den
        if HAS_DRAFT_PROBS:
            dp = tl.load(dp_ptr + row * vocab + idx, mask=in_vocab, other=0.0).to(tl.float32)
            residual = tl.maximum(p - dp, 0.0)
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
    vocab, batch, n_tiles,
    BLOCK_V: tl.constexpr, BLOCK_B: tl.constexpr, FRAC: tl.constexpr,
    ALL_GREEDY: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, SEEDED: tl.constexpr,
    SCORE_DTYPE: tl.constexpr,
):
    """SPLITS == 1: every pass over one draft row, in one program."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * vocab
    zero = tl.zeros((), tl.int64)
    row_max, row_arg = _chunk_max(x_row, zero, vocab, n_tiles, BLOCK_V)
    tl.store(part_max_ptr + row, row_max)
    tl.store(part_arg_ptr + row, row_arg)
    if not ALL_GREEDY:
        req, start = _request_of_row(row, cu_ptr, batch, BLOCK_B)
        if not tl.load(greedy_ptr + req):
            draft = tl.load(draft_ptr + row).to(tl.int64)
            sum_fixed = _chunk_sum_fixed(x_row, zero, vocab, n_tiles, row_max, BLOCK_V, FRAC)
            inv_den = _inv_denominator(sum_fixed, FRAC)
            accepted = _accept_draft(
                x_ptr, dp_ptr, row, req, row - start, draft, row_max, inv_den, u_ptr,
                seed_ptr, vocab, HAS_DRAFT_PROBS, SEEDED,
            )
            tl.store(accept_ptr + row, accepted.to(tl.int8))
            # The recovered token matters only where this row's draft is rejected.
            if not accepted:
                score, idx = _chunk_recover(
                    x_ptr, dp_ptr, q_ptr, seed_ptr, row, req, draft, zero, vocab, n_tiles,
                    row_max, inv_den, BLOCK_V, HAS_DRAFT_PROBS, SEEDED, SCORE_DTYPE,
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
    best, best_idx = _chunk_max(x_ptr + row * vocab, lo, vocab, n_tiles, BLOCK_V)
    tl.store(part_max_ptr + pid, best)
    tl.store(part_arg_ptr + pid, best_idx)


@triton.jit
def _row_max_from_parts(part_max_ptr, row, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr):
    offs = tl.arange(0, BLOCK_S)
    parts = tl.load(part_max_ptr + row * SPLITS + offs, mask=offs < SPLITS, other=float("-inf"))
    return tl.max(parts, axis=0)


@triton.jit
def _split_sum_kernel(
    x_ptr, cu_ptr, greedy_ptr, part_max_ptr, part_sum_ptr, vocab, batch, n_tiles, chunk,
    SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_B: tl.constexpr,
    FRAC: tl.constexpr,
):
    """SPLITS > 1, launch 2 (random rows): fixed-point softmax denominator of each chunk."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // SPLITS
    req, _ = _request_of_row(row, cu_ptr, batch, BLOCK_B)
    if not tl.load(greedy_ptr + req):
        row_max = _row_max_from_parts(part_max_ptr, row, SPLITS, BLOCK_S)
        lo = (pid % SPLITS) * chunk
        acc = _chunk_sum_fixed(x_ptr + row * vocab, lo, vocab, n_tiles, row_max, BLOCK_V, FRAC)
        tl.store(part_sum_ptr + pid, acc)


@triton.jit
def _split_recover_kernel(
    x_ptr, dp_ptr, draft_ptr, cu_ptr, greedy_ptr, u_ptr, q_ptr, seed_ptr,
    part_max_ptr, part_sum_ptr, part_score_ptr, part_idx_ptr, accept_ptr,
    vocab, batch, n_tiles, chunk,
    SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_B: tl.constexpr,
    FRAC: tl.constexpr, HAS_DRAFT_PROBS: tl.constexpr, SEEDED: tl.constexpr,
    SCORE_DTYPE: tl.constexpr,
):
    """SPLITS > 1, launch 3 (random rows): acceptance, and recovered-token partials."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // SPLITS
    split = pid % SPLITS
    req, start = _request_of_row(row, cu_ptr, batch, BLOCK_B)
    if not tl.load(greedy_ptr + req):
        row_max = _row_max_from_parts(part_max_ptr, row, SPLITS, BLOCK_S)
        offs = tl.arange(0, BLOCK_S)
        sums = tl.load(part_sum_ptr + row * SPLITS + offs, mask=offs < SPLITS, other=0)
        sum_fixed = tl.sum(sums, axis=0)
        inv_den = _inv_denominator(sum_fixed, FRAC)
        draft = tl.load(draft_ptr + row).to(tl.int64)
        accepted = _accept_draft(
            x_ptr, dp_ptr, row, req, row - start, draft, row_max, inv_den, u_ptr, seed_ptr,
            vocab, HAS_DRAFT_PROBS, SEEDED,
        )
        if split == 0:
            tl.store(accept_ptr + row, accepted.to(tl.int8))
        if not accepted:
            score, idx = _chunk_recover(
                x_ptr, dp_ptr, q_ptr, seed_ptr, row, req, draft, split * chunk, vocab, n_tiles,
                row_max, inv_den, BLOCK_V, HAS_DRAFT_PROBS, SEEDED, SCORE_DTYPE,
            )
            tl.store(part_score_ptr + pid, score)
            tl.store(part_idx_ptr + pid, idx)


@triton.jit
def _argmax_of_parts(value_ptr, index_ptr, row, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr):
    """Reduce per-split (value, index) partials; the lowest split wins ties."""
    offs = tl.arange(0, BLOCK_S)
    values = tl.load(value_ptr + row * SPLITS + offs, mask=offs < SPLITS, other=float("-inf"))
    _, which = tl.max(values, axis=0, return_indices=True)
    return tl.load(index_ptr + row * SPLITS + which)


@triton.jit
def _finalize_kernel(
    out_ptr, draft_ptr, cu_ptr, bonus_ptr, greedy_ptr,
    part_max_ptr, part_arg_ptr, part_score_ptr, part_idx_ptr, accept_ptr,
    max_spec_len,
    SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr,
    ALL_GREEDY: tl.constexpr,
):
    """One program per request: walk the chain, emit tokens, -1 after the first rejection."""
    req = tl.program_id(0).to(tl.int64)
    start = tl.load(cu_ptr + req - 1, mask=req > 0, other=0).to(tl.int64)
    end = tl.load(cu_ptr + req).to(tl.int64)
    n = end - start
    if ALL_GREEDY:
        greedy = True
    else:
        greedy = tl.load(greedy_ptr + req) != 0
    offs = tl.arange(0, BLOCK_K)
    tokens = tl.full((BLOCK_K,), -1, tl.int32)
    rejected = False
    for pos in range(n):
        if not rejected:
            row = start + pos
            draft = tl.load(draft_ptr + row).to(tl.int32)
            if greedy:
                token = _argmax_of_parts(part_max_ptr, part_arg_ptr, row, SPLITS, BLOCK_S)
                accepted = draft == token
            else:
                accepted = tl.load(accept_ptr + row) != 0
                if accepted:
                    token = draft
                else:
                    token = _argmax_of_parts(part_score_ptr, part_idx_ptr, row, SPLITS, BLOCK_S)
            tokens = tl.where(offs == pos, token, tokens)
            rejected = not accepted
    if not rejected:
        bonus = tl.load(bonus_ptr + req).to(tl.int32)
        tokens = tl.where(offs == n, bonus, tokens)
    tl.store(out_ptr + req * (max_spec_len + 1) + offs, tokens, mask=offs <= max_spec_len)


# --------------------------------------------------------------------------------------
# Search space and defaults
# --------------------------------------------------------------------------------------

SEARCH_SPACE = SearchSpace(
    params=(
        Param("BLOCK_V", (256, 512, 1024, 2048, 4096, 8192, 16384), power_of_two=True,
              doc="vocab tile one program loads per step"),
        Param("SPLITS", (1, 2, 4, 8, 16, 32, 64), power_of_two=True,
              doc="programs one vocab row is split across (second-stage reduction)"),
        Param("num_warps", (1, 2, 4, 8, 16), power_of_two=True, doc="warps per program"),
        Param("num_stages", (1, 2, 3, 4), doc="software-pipelining depth of the tile loop"),
        Param("waves_per_eu", (0, 1, 2, 3, 4), backends=("hip",),
              doc="AMD occupancy hint: waves per execution unit (0 = compiler's choice)"),
    ),
    constraints=(
        Constraint(
            "BLOCK_V >= 64 * num_warps: every lane of a 64-wide wavefront holds an element",
            lambda c: c["BLOCK_V"] >= 64 * c["num_warps"],
        ),
    ),
)

# Defaults: vLLM's tile and warps, with enough splits that about this many programs
# stream the vocabulary (a few per compute unit on a 100-300 CU GPU).
_DEFAULT_BLOCK_V = 8192
_DEFAULT_NUM_WARPS = 4
_DEFAULT_NUM_STAGES = 2
_DEFAULT_TARGET_PROGRAMS = 512


def search_space(backend: str) -> SearchSpace:
    """The declared launch space on ``backend`` (``waves_per_eu`` only on HIP)."""
    return SEARCH_SPACE.for_backend(backend)


def default_config(problem: Problem, backend: str) -> dict[str, int]:
    """Deterministic config used when nothing is tuned for ``problem``."""
    rows = problem.spec_len * problem.batch
    tiles = triton.cdiv(problem.vocab, _DEFAULT_BLOCK_V)
    want = max(1, triton.cdiv(_DEFAULT_TARGET_PROGRAMS, rows))
    splits_values = SEARCH_SPACE.param("SPLITS").values
    splits = max(s for s in splits_values if s <= min(want, tiles) or s == splits_values[0])
    config = {
        "BLOCK_V": _DEFAULT_BLOCK_V,
        "SPLITS": splits,
        "num_warps": _DEFAULT_NUM_WARPS,
        "num_stages": _DEFAULT_NUM_STAGES,
    }
    if backend == "hip":
        config["waves_per_eu"] = 0
    return search_space(backend).validate(config)


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
    config: Mapping[str, int] | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Verify speculative drafts against target logits; vLLM 0.32 V1 semantics.

    Args:
        draft_token_ids: ``[N]`` int32/int64 drafts of all requests, concatenated;
            ``-1`` marks a padded draft, which is always rejected.
        cu_num_draft_tokens: ``[B]`` int32/int64 inclusive cumulative draft counts.
        target_logits: ``[N, V]`` float32/bfloat16/float16 target logits, temperature,
            top-k and top-p already applied.
        bonus_token_ids: ``[B]`` or ``[B, 1]`` int32/int64, emitted when every draft of
            a request is accepted.
        max_spec_len: Most drafts any request has; the output has ``max_spec_len + 1``
            columns.
        draft_probs: ``[N, V]`` float32 drafter probabilities; ``None`` for drafters
            without probabilities (ngram).
        is_greedy: ``[B]`` bool; ``None`` means every request is greedy.
        uniform_probs: ``[N]`` float64/float32 acceptance coins (random requests).
        inv_q: ``[B, V]`` float32/float64 reciprocals of Exp(1) draws (random requests).
        seeds: ``[B]`` int64; instead of ``uniform_probs``/``inv_q`` the kernels draw
            their own (Philox), the same for a seed on any configuration.
        config: Launch configuration (see :func:`search_space`); ``None`` uses
            :func:`default_config`.
        validate: Check values that need the tensors' contents (monotonic
            ``cu_num_draft_tokens``, draft counts) as well as shapes and dtypes. Callers
            that guarantee them (the vLLM hook) pass ``False`` to avoid a device sync.

    Returns:
        ``[B, max_spec_len + 1]`` int32 tokens; ``-1`` where nothing was emitted.

    Raises:
        ValueError: naming the offending argument, before any launch.
    """
    args = _check_inputs(
        draft_token_ids, cu_num_draft_tokens, target_logits, bonus_token_ids,
        max_spec_len=max_spec_len, draft_probs=draft_probs, is_greedy=is_greedy,
        uniform_probs=uniform_probs, inv_q=inv_q, seeds=seeds, validate=validate,
    )
    n_rows, vocab = target_logits.shape
    batch = cu_num_draft_tokens.shape[0]
    backend = _backend_of(target_logits.device)
    if config is None:
        problem = Problem(
            spec_len=max(max_spec_len, 1), batch=max(batch, 1), vocab=vocab,
            dtype=str(target_logits.dtype).removeprefix("torch."),
            draft_probs=draft_probs is not None,
        )
        config = default_config(problem, backend)
    else:
        config = search_space(backend).validate(config)
    return _launch(
        args, n_rows=n_rows, vocab=vocab, batch=batch, max_spec_len=max_spec_len,
        config=config, backend=backend,
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


def _launch(
    args: _Args, *, n_rows: int, vocab: int, batch: int, max_spec_len: int,
    config: Mapping[str, int], backend: str,
) -> torch.Tensor:
    device = args.logits.device
    out = torch.empty((batch, max_spec_len + 1), dtype=torch.int32, device=device)
    if batch == 0:
        return out
    all_greedy = args.is_greedy is None
    seeded = args.seeds is not None
    block_v = min(config["BLOCK_V"], triton.next_power_of_2(vocab))
    tiles = triton.cdiv(vocab, block_v)
    tiles_per_split = triton.cdiv(tiles, min(config["SPLITS"], tiles))
    splits = triton.cdiv(tiles, tiles_per_split)
    chunk = tiles_per_split * block_v
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
    launch_opts: dict[str, Any] = {
        "num_warps": config["num_warps"], "num_stages": config["num_stages"],
    }
    if backend == "hip":
        launch_opts["waves_per_eu"] = config["waves_per_eu"]
    block_b = triton.next_power_of_2(batch)
    block_s = triton.next_power_of_2(splits)
    flags = {"HAS_DRAFT_PROBS": args.draft_probs is not None, "SEEDED": seeded}

    if n_rows > 0 and splits == 1:
        _fused_row_kernel[(n_rows,)](
            args.logits, dp, args.draft, args.cu, greedy, u, q, seeds,
            part_max, part_arg, part_score, part_idx, accept,
            vocab, batch, tiles,
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
                args.logits, args.cu, greedy, part_max, part_sum, vocab, batch,
                tiles_per_split, chunk,
                SPLITS=splits, BLOCK_S=block_s, BLOCK_V=block_v, BLOCK_B=block_b,
                FRAC=FIXED_POINT_BITS, **launch_opts,
            )
            _split_recover_kernel[grid](
                args.logits, dp, args.draft, args.cu, greedy, u, q, seeds,
                part_max, part_sum, part_score, part_idx, accept,
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


def _backend_of(device: torch.device) -> str:
    if device.type == "cpu":
        return "cpu-interpreter"
    return "hip" if torch.version.hip is not None else "cuda"


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
    validate: bool,
) -> _Args:
    _require_tensor("target_logits", target_logits, ndim=2, dtypes=_LOGITS_DTYPES)
    n_rows, vocab = target_logits.shape
    device = target_logits.device
    if vocab < 1:
        raise ValueError("target_logits: vocab size (dim 1) must be at least 1")
    if vocab > MAX_VOCAB:
        raise ValueError(f"target_logits: vocab size {vocab} exceeds the supported {MAX_VOCAB}")
    if isinstance(max_spec_len, bool) or not isinstance(max_spec_len, int) or max_spec_len < 0:
        raise ValueError(f"max_spec_len must be a non-negative int, got {max_spec_len!r}")
    _require_tensor("draft_token_ids", draft_token_ids, ndim=1, dtypes=_INDEX_DTYPES,
                    device=device, shape=(n_rows,))
    _require_tensor("cu_num_draft_tokens", cu_num_draft_tokens, ndim=1, dtypes=_INDEX_DTYPES,
                    device=device)
    batch = cu_num_draft_tokens.shape[0]
    _require_tensor("bonus_token_ids", bonus_token_ids, dtypes=_INDEX_DTYPES, device=device)
    if tuple(bonus_token_ids.shape) not in ((batch,), (batch, 1)):
        raise ValueError(
            f"bonus_token_ids must have shape [{batch}] or [{batch}, 1], "
            f"got {list(bonus_token_ids.shape)}"
        )
    if draft_probs is not None:
        _require_tensor("draft_probs", draft_probs, ndim=2, dtypes=(torch.float32,),
                        device=device, shape=(n_rows, vocab))
    if is_greedy is not None:
        _require_tensor("is_greedy", is_greedy, ndim=1, dtypes=(torch.bool,), device=device,
                        shape=(batch,))
    if uniform_probs is not None:
        _require_tensor("uniform_probs", uniform_probs, ndim=1,
                        dtypes=(torch.float64, torch.float32), device=device, shape=(n_rows,))
    if inv_q is not None:
        _require_tensor("inv_q", inv_q, ndim=2, dtypes=(torch.float32, torch.float64),
                        device=device, shape=(batch, vocab))
    if seeds is not None:
        _require_tensor("seeds", seeds, ndim=1, dtypes=(torch.int64,), device=device,
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
        if n_rows > 0 and bool((draft_token_ids >= vocab).any()):
            raise ValueError(f"draft_token_ids must be < vocab size {vocab} (or -1 for padding)")
    elif batch == 0 and n_rows != 0:
        raise ValueError("cu_num_draft_tokens is empty but draft_token_ids is not")
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
    )


def _require_tensor(
    name: str,
    value: object,
    *,
    ndim: int | None = None,
    dtypes: tuple[torch.dtype, ...],
    device: torch.device | None = None,
    shape: tuple[int, ...] | None = None,
) -> None:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {list(value.shape)}")
    if value.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name} must have dtype {allowed}; got {value.dtype}")
    if device is not None and value.device != device:
        raise ValueError(f"{name} is on {value.device}, target_logits on {device}")
    if shape is not None and tuple(value.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(value.shape)}")
    if not value.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


# --------------------------------------------------------------------------------------
# Host-side random streams (the same numbers the kernels draw with ``seeds``)
# --------------------------------------------------------------------------------------

def draw_random_inputs(
    seeds: torch.Tensor, cu_num_draft_tokens: torch.Tensor, *, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The coins and exponentials the kernels draw for ``seeds``, computed on the host.

    Args:
        seeds: ``[B]`` int64 per-request seeds.
        cu_num_draft_tokens: ``[B]`` inclusive cumulative draft counts.
        vocab: Vocabulary size.

    Returns:
        ``(uniform_probs [N] float64, inv_q [B, V] float32)`` such that passing them
        instead of ``seeds`` gives the same tokens (up to the device's ``log``).
    """
    seeds_list = [int(s) for s in seeds.cpu()]
    cu = [int(c) for c in cu_num_draft_tokens.cpu()]
    n_rows = cu[-1] if cu else 0
    uniform = torch.empty(n_rows, dtype=torch.float64)
    inv_q = torch.empty((len(seeds_list), vocab), dtype=torch.float32)
    start = 0
    vocab_idx = torch.arange(vocab, dtype=torch.int64)
    for req, seed in enumerate(seeds_list):
        end = cu[req]
        if end > start:
            a, b = philox(seed, torch.arange(end - start, dtype=torch.int64), 1)
            bits = (a << 20) | (b >> 12)
            uniform[start:end] = (bits.to(torch.float64) + 0.5) * (1.0 / 4503599627370496.0)
        a, _ = philox(seed, vocab_idx, 0)
        u = ((a >> 9).to(torch.float32) + 0.5) * (1.0 / 8388608.0)
        q = torch.clamp(-torch.log(u), min=1.1754943508222875e-38)
        inv_q[req] = 1.0 / q
        start = end
    return uniform, inv_q


# --------------------------------------------------------------------------------------
# PyTorch reference (written from vLLM's semantics, not from the kernels above)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RejectionInputs:
    """Arguments of one :func:`rejection_sample` call, as the tuner passes them around."""

    draft_token_ids: torch.Tensor
    cu_num_draft_tokens: torch.Tensor
    target_logits: torch.Tensor
    bonus_token_ids: torch.Tensor
    max_spec_len: int
    draft_probs: torch.Tensor | None = None
    is_greedy: torch.Tensor | None = None
    uniform_probs: torch.Tensor | None = None
    inv_q: torch.Tensor | None = None
    seeds: torch.Tensor | None = None

    def kwargs(self) -> dict[str, Any]:
        return {
            "max_spec_len": self.max_spec_len,
            "draft_probs": self.draft_probs,
            "is_greedy": self.is_greedy,
            "uniform_probs": self.uniform_probs,
            "inv_q": self.inv_q,
            "seeds": self.seeds,
        }

    def args(self) -> tuple[torch.Tensor, ...]:
        return (
            self.draft_token_ids, self.cu_num_draft_tokens, self.target_logits,
            self.bonus_token_ids,
        )


@dataclass(frozen=True)
class ReferenceResult:
    """Reference tokens and, per output position, whether rounding could flip it.

    Attributes:
        tokens: ``[B, max_spec_len + 1]`` int32, as :func:`rejection_sample` returns.
        near_tie: ``[B, max_spec_len + 1]`` bool; True where the decision emitted at
            that position (acceptance or recovered token) has a relative margin below
            :data:`NEAR_TIE_RTOL`, so float rounding of the softmax may decide it.
    """

    tokens: torch.Tensor
    near_tie: torch.Tensor


def rejection_sample_reference(
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
    rtol: float = NEAR_TIE_RTOL,
) -> ReferenceResult:
    """Plain PyTorch version of vLLM 0.32's V1 rejection sampling (GPU semantics).

    Probabilities are ``torch.softmax`` in float32, as vLLM computes them. With
    ``seeds``, the random inputs are those of :func:`draw_random_inputs`.
    """
    logits = target_logits.detach().cpu().float()
    n_rows, vocab = logits.shape
    cu = [int(c) for c in cu_num_draft_tokens.cpu()]
    batch = len(cu)
    drafts = draft_token_ids.cpu().to(torch.int64)
    bonus = bonus_token_ids.cpu().reshape(batch).to(torch.int64)
    if seeds is not None:
        uniform_probs, inv_q = draw_random_inputs(seeds, cu_num_draft_tokens, vocab=vocab)
    greedy = (
        [True] * batch if is_greedy is None else [bool(g) for g in is_greedy.cpu()]
    )
    argmax = logits.argmax(dim=-1) if n_rows else torch.empty(0, dtype=torch.int64)
    probs = torch.softmax(logits, dim=-1) if not all(greedy) else None
    dprobs = draft_probs.detach().cpu().float() if draft_probs is not None else None
    coins = uniform_probs.cpu().double() if uniform_probs is not None else None
    inv_q_cpu = inv_q.cpu() if inv_q is not None else None

    tokens = torch.full((batch, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
    near = torch.zeros((batch, max_spec_len + 1), dtype=torch.bool)
    start = 0
    for req in range(batch):
        end = cu[req]
        rejected = False
        for pos, row in enumerate(range(start, end)):
            d = int(drafts[row])
            if greedy[req]:
                token = int(argmax[row])
                rejected = d != token
            else:
                assert probs is not None and coins is not None and inv_q_cpu is not None
                p = probs[row]
                dp_d = float(dprobs[row, d]) if (dprobs is not None and d >= 0) else 1.0
                accepted = False
                if d >= 0 and dp_d > 0:
                    ratio = float(torch.tensor(float(p[d])) / torch.tensor(dp_d))
                    u = float(coins[row])
                    accepted = ratio >= u
                    if abs(ratio - u) <= rtol * max(ratio, u):
                        near[req, pos] = True
                if accepted:
                    token = d
                else:
                    rejected = True
                    token, tie = _recovered_token(
                        p, None if dprobs is None else dprobs[row], d, inv_q_cpu[req], rtol
                    )
                    near[req, pos] |= tie
            tokens[req, pos] = token
            if rejected:
                break
        if not rejected:
            tokens[req, end - start] = int(bonus[req])
        start = end
    return ReferenceResult(tokens=tokens, near_tie=near)


def _recovered_token(
    p: torch.Tensor, dp: torch.Tensor | None, draft: int, inv_q: torch.Tensor, rtol: float
) -> tuple[int, bool]:
    if dp is not None:
        residual = torch.clamp(p - dp, min=0.0)
    else:
        residual = p.clone()
        if draft >= 0:
            residual[draft] = 0.0
    score = residual.to(inv_q.dtype) * inv_q
    best = int(torch.argmax(score))
    top = torch.topk(score, k=min(2, score.numel())).values
    # A near-tie: the runner-up is within rtol of the winner, or every score is so small
    # that rounding of p decides it (an all-zero residual, p == dp).
    tie = top.numel() > 1 and float(top[0] - top[1]) <= rtol * float(top[0])
    return best, tie


def decision_margins_agree(
    expected: ReferenceResult, actual: torch.Tensor
) -> tuple[bool, str]:
    """Whether ``actual`` tokens equal the reference's, a near-tie apart.

    Each request must match position by position up to its first difference, and that
    difference must sit at or after a position the reference flagged as a near-tie (a
    flipped decision changes everything after it).

    Returns:
        ``(agree, why_not)``.
    """
    exp_tokens = expected.tokens
    act = actual.detach().cpu().to(torch.int32)
    if act.shape != exp_tokens.shape:
        return False, f"shape {list(act.shape)} != {list(exp_tokens.shape)}"
    diff = act != exp_tokens
    for req in torch.nonzero(diff.any(dim=1)).flatten().tolist():
        first = int(torch.nonzero(diff[req]).flatten()[0])
        if not bool(expected.near_tie[req, : first + 1].any()):
            return False, (
                f"request {req}: position {first} expected {exp_tokens[req].tolist()}, "
                f"got {act[req].tolist()} (no near-tie before it)"
            )
    return True, ""


# --------------------------------------------------------------------------------------
# The kernel family, as the tuner sees it
# --------------------------------------------------------------------------------------

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Shape of the synthetic logits: a few dominant tokens (together ~95% of the mass, at
# any vocabulary size) over a Gaussian floor, and a drafter that sees them through
# noise, so drafts are accepted at realistic rates and some are rejected (every pass
# of the kernels runs).
_LOGIT_SCALE = 2.0
_LOGIT_PEAK_OVER_LOG_V = 4.0
_PEAKS = 4
_DRAFT_NOISE = 1.0


class RejectionSampleFamily:
    """Chain verification (greedy + rejection sampling) as a tunable kernel family."""

    name = "rejection_sample"

    def __init__(self) -> None:
        import inspect
        import sys

        from spectune.identity import source_hash

        self.source_hash = source_hash(inspect.getsource(sys.modules[__name__]))

    def search_space(self, backend: str) -> SearchSpace:
        return search_space(backend)

    def default_config(self, problem: Problem, backend: str) -> dict[str, int]:
        return default_config(problem, backend)

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> RejectionInputs:
        """Every request random with ``k`` drafts sampled from the drafter."""
        gen = torch.Generator().manual_seed(seed)
        batch, k, vocab = problem.batch, problem.spec_len, problem.vocab
        n_rows = batch * k
        logits = torch.randn(n_rows, vocab, generator=gen) * _LOGIT_SCALE
        peaks = torch.randint(0, vocab, (n_rows, _PEAKS), generator=gen)
        height = math.log(vocab) + _LOGIT_PEAK_OVER_LOG_V
        logits.scatter_add_(1, peaks, torch.full((n_rows, _PEAKS), height))
        draft_logits = logits + torch.randn(n_rows, vocab, generator=gen) * _DRAFT_NOISE
        draft_probs = torch.softmax(draft_logits, dim=-1)
        drafts = torch.multinomial(draft_probs, 1, generator=gen).flatten()
        cu = torch.arange(1, batch + 1, dtype=torch.int32) * k
        inv_q = 1.0 / torch.empty(batch, vocab).exponential_(generator=gen)
        return RejectionInputs(
            draft_token_ids=drafts.to(torch.int32).to(device),
            cu_num_draft_tokens=cu.to(device),
            target_logits=logits.to(_DTYPES[problem.dtype]).to(device),
            bonus_token_ids=torch.randint(0, vocab, (batch, 1), generator=gen).to(device),
            max_spec_len=k,
            draft_probs=draft_probs.to(device) if problem.draft_probs else None,
            is_greedy=torch.zeros(batch, dtype=torch.bool, device=device),
            uniform_probs=torch.rand(n_rows, generator=gen, dtype=torch.float64).to(device),
            inv_q=inv_q.to(device),
        )

    def launch(self, inputs: RejectionInputs, config: Mapping[str, int]) -> torch.Tensor:
        return rejection_sample(*inputs.args(), **inputs.kwargs(), config=config, validate=False)

    def reference(self, inputs: RejectionInputs) -> ReferenceResult:
        return rejection_sample_reference(*inputs.args(), **inputs.kwargs())

    def same(self, expected: ReferenceResult | torch.Tensor, actual: torch.Tensor) -> bool:
        """Bit-identical tokens; against a reference, a near-tie apart (see NEAR_TIE_RTOL)."""
        if isinstance(expected, ReferenceResult):
            return decision_margins_agree(expected, actual)[0]
        return torch.equal(expected.cpu(), actual.cpu())


FAMILY = RejectionSampleFamily()
