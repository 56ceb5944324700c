"""Exact top-k / top-p thresholds of a vocabulary row, the same under every launch config.

Top-k and top-p both keep the tokens whose logit is at least a threshold (top-k: every
logit >= the k-th largest, ties included; top-p: every logit whose strictly larger
logits hold less than ``p`` of the probability mass). Each threshold is found by a
search over the row's logits in a total order (:func:`order_key`: float32 bits mapped to
int64, ``-0.0`` folded into ``0.0``): each pass over the row tests ``PIVOTS`` candidate
thresholds at once and narrows the interval that holds the answer, until one key is
left. Nothing is sorted and no logit is written until the threshold is known.

Why the result never depends on the config: the quantity each pass sums per candidate
is an integer. For top-k, a count. For top-p, each token's probability weight in fixed
point, ``floor(exp(x - max) * 2**FIXED_POINT_BITS)`` (``exp`` per element, so the
same on every tile size), summed in int64: integer sums do not depend on their order,
so tile size, warps or pivots change how many passes run, never the threshold. The
fixed point drops weights under ``2**-42`` of the largest, at most ``V * 2**-42`` of the
mass (under ``5e-7`` for every supported vocabulary).

Part of the source hash of every family that uses it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from spectune.kernels.rejection.rejection_sample_constants import FIXED_POINT_BITS

__all__ = [
    "ROUNDED_DIV",
    "TRITON_DIV",
    "divide",
    "keep_threshold",
    "load_values",
    "mass_at_or_above",
    "mass_weight",
    "order_key",
    "processed_threshold",
    "row_stats",
    "smallest_value_below",
]

#: ``PROCESS`` modes of :func:`load_values`: Triton's float32 ``/`` (what vLLM's Triton
#: sampling kernels divide with: ``div.full.f32`` on NVIDIA, within 2 ulps), or the
#: correctly rounded quotient (what PyTorch's ``div_`` gives, as vLLM V1's sampler).
TRITON_DIV = tl.constexpr(1)
ROUNDED_DIV = tl.constexpr(2)

# 2**FIXED_POINT_BITS, the weight of the row's largest logit.
_WEIGHT_SCALE = tl.constexpr(float(2**FIXED_POINT_BITS))


@triton.jit
def order_key(x):
    """int64 keys in the order of the float32 values ``x`` (``-0.0`` equal to ``0.0``).

    A non-negative float's bits already sort as integers; a negative float's magnitude
    bits sort backwards, so they are flipped.
    """
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)


@triton.jit
def mass_weight(x, row_max):
    """Fixed-point probability weight of logits ``x`` (float32) in a row whose largest
    logit is ``row_max``: ``floor(exp(x - row_max) * 2**FIXED_POINT_BITS)`` as int64.

    ``-inf`` logits weigh 0; the row's maximum weighs ``2**FIXED_POINT_BITS``.
    """
    return (tl.exp(x - row_max) * _WEIGHT_SCALE).to(tl.int64)


@triton.jit
def divide(x, temp, DIV: tl.constexpr):
    """``x / temp`` in float32, as :data:`TRITON_DIV` or :data:`ROUNDED_DIV` says."""
    if DIV == ROUNDED_DIV:
        return tl.math.div_rn(x, temp)
    else:
        return x / temp


@triton.jit
def load_values(x_ptr, idx, in_vocab, temp, min_value, PROCESS: tl.constexpr):
    """The row's values at ``idx`` as float32 (``-inf`` outside the vocabulary).

    With ``PROCESS`` (0: none, else the division's mode, :data:`TRITON_DIV` or
    :data:`ROUNDED_DIV`) they are what vLLM's sampler makes of the logits first: divided
    by the temperature ``temp`` (1 leaves them as they are), then ``-inf`` below
    ``min_value`` (min-p's threshold; ``-inf`` masks nothing).
    """
    x = tl.load(x_ptr + idx, mask=in_vocab, other=float("-inf")).to(tl.float32)
    if PROCESS:
        x = divide(x, temp, PROCESS)
        x = tl.where(x < min_value, float("-inf"), x)
    return x


@triton.jit
def row_stats(x_ptr, vocab, n_tiles, temp, min_value, PROCESS: tl.constexpr,
              BLOCK_V: tl.constexpr):
    """Largest and smallest value (float32) of a row of ``vocab`` values (see
    :func:`load_values`)."""
    offs = tl.arange(0, BLOCK_V)
    row_max = tl.full((), float("-inf"), tl.float32)
    row_min = tl.full((), float("inf"), tl.float32)
    for t in range(n_tiles):
        idx = t * BLOCK_V + offs
        in_vocab = idx < vocab
        x = load_values(x_ptr, idx, in_vocab, temp, min_value, PROCESS)
        row_max = tl.maximum(row_max, tl.max(x, axis=0))
        row_min = tl.minimum(row_min, tl.min(tl.where(in_vocab, x, float("inf")), axis=0))
    return row_max, row_min


@triton.jit
def smallest_value_below(
    x_ptr, vocab, n_tiles, temp, min_value, lo_value, hi_value, floor_key, row_max, bound,
    PROCESS: tl.constexpr, WEIGHTED: tl.constexpr, BLOCK_V: tl.constexpr,
    PIVOTS: tl.constexpr,
):
    """The smallest value ``T`` of the row in ``[lo_value, hi_value]`` (both values of
    the row) whose strictly larger values sum below ``bound``; the caller knows
    ``T = hi_value`` qualifies.

    What is summed over the values with key ``> key(T)``: their count (``WEIGHTED``
    false; ``bound`` an integer: top-k's ``k``), or their :func:`mass_weight`, counting
    only values with key ``>= floor_key`` (``WEIGHTED`` true; ``bound`` a float64: top-p's
    ``p`` times the kept mass). The sum only shrinks as ``T`` grows, and only changes at
    the row's values, so the answer is one of them. Each pass tests ``PIVOTS`` keys
    spread evenly (by value) over the interval, then narrows it to the row values next
    to the boundary: a few passes at any vocabulary, one or two at a small one.
    """
    offs = tl.arange(0, BLOCK_V)
    steps = tl.arange(0, PIVOTS).to(tl.float64)
    lo = order_key(lo_value)
    hi = order_key(hi_value)
    while lo < hi:
        if lo_value == float("-inf"):
            # No span to divide: the first pivot tests -inf itself, the rest spread by key.
            pivots = lo + ((hi - lo) * steps.to(tl.int64)) // PIVOTS
        else:
            span = hi_value.to(tl.float64) - lo_value.to(tl.float64)
            spread = lo_value.to(tl.float64) + span * (steps + 1) / (PIVOTS + 1)
            pivots = order_key(spread.to(tl.float32))
        pivots = tl.minimum(tl.maximum(pivots, lo), hi - 1)
        above = tl.zeros((PIVOTS,), tl.int64)
        next_up = tl.full((PIVOTS,), float("inf"), tl.float32)
        next_down = tl.full((PIVOTS,), float("-inf"), tl.float32)
        for t in range(n_tiles):
            idx = t * BLOCK_V + offs
            in_vocab = idx < vocab
            x = load_values(x_ptr, idx, in_vocab, temp, min_value, PROCESS)
            key = order_key(x)
            if WEIGHTED:
                amount = tl.where(in_vocab & (key >= floor_key), mass_weight(x, row_max), 0)
            else:
                amount = in_vocab.to(tl.int64)
            hit = key[None, :] > pivots[:, None]
            above += tl.sum(tl.where(hit, amount[None, :], 0), axis=1)
            # The row's values next to each pivot: the smallest above, the largest at or
            # under it.
            live = in_vocab[None, :]
            next_up = tl.minimum(next_up, tl.min(tl.where(hit & live, x[None, :], float("inf")),
                                                 axis=1))
            next_down = tl.maximum(next_down, tl.max(
                tl.where(~hit & live, x[None, :], float("-inf")), axis=1))
        if WEIGHTED:
            below = above.to(tl.float64) < bound
        else:
            below = above < bound
        # The test is monotone in the pivot: the answer lies between the smallest value
        # above the largest failing pivot and the largest value at or under the smallest
        # passing one.
        hi_value = tl.min(tl.where(below, next_down, hi_value), axis=0)
        lo_value = tl.max(tl.where(below, lo_value, next_up), axis=0)
        lo = order_key(lo_value)
        hi = order_key(hi_value)
    return lo_value


@triton.jit
def mass_at_or_above(x_ptr, vocab, n_tiles, temp, min_value, floor_key, row_max,
                     PROCESS: tl.constexpr, BLOCK_V: tl.constexpr):
    """Sum of :func:`mass_weight` over the logits with key ``>= floor_key`` (int64)."""
    offs = tl.arange(0, BLOCK_V)
    total = tl.zeros((), tl.int64)
    for t in range(n_tiles):
        idx = t * BLOCK_V + offs
        in_vocab = idx < vocab
        x = load_values(x_ptr, idx, in_vocab, temp, min_value, PROCESS)
        kept = in_vocab & (order_key(x) >= floor_key)
        total += tl.sum(tl.where(kept, mass_weight(x, row_max), 0), axis=0)
    return total


@triton.jit
def keep_threshold(
    x_ptr, vocab, n_tiles, temp, min_value, row_max, row_min, k, p,
    PROCESS: tl.constexpr, HAS_K: tl.constexpr, HAS_P: tl.constexpr,
    BLOCK_V: tl.constexpr, PIVOTS: tl.constexpr,
):
    """The smallest key top-k then top-p keep in a row (every key ``>=`` it is kept).

    ``row_max``, ``row_min``: the row's largest and smallest value (:func:`row_stats`).
    Top-k is on when ``1 <= k < vocab``, top-p when ``p < 1``; with neither, the key of
    ``row_min`` (everything kept).
    """
    threshold = row_min
    if HAS_K and (k >= 1) & (k < vocab):
        # Top-k: the smallest T with fewer than k values above it is the k-th largest.
        threshold = smallest_value_below(
            x_ptr, vocab, n_tiles, temp, min_value, row_min, row_max, 0, row_max, k,
            PROCESS, False, BLOCK_V, PIVOTS,
        )
    if HAS_P and p < 1.0:
        # Top-p on what top-k kept: a value stays while the mass strictly above it is
        # under p of the kept mass (so the largest always stays).
        floor_key = order_key(threshold)
        kept_mass = mass_at_or_above(x_ptr, vocab, n_tiles, temp, min_value, floor_key,
                                     row_max, PROCESS, BLOCK_V)
        bound = p.to(tl.float64) * kept_mass.to(tl.float64)
        threshold = smallest_value_below(
            x_ptr, vocab, n_tiles, temp, min_value, threshold, row_max, floor_key,
            row_max, bound, PROCESS, True, BLOCK_V, PIVOTS,
        )
    return order_key(threshold)


@triton.jit
def processed_threshold(
    x_ptr, vocab, n_tiles, temp, min_p, k, p,
    DIV: tl.constexpr, HAS_K: tl.constexpr, HAS_P: tl.constexpr, BLOCK_V: tl.constexpr,
    PIVOTS: tl.constexpr,
):
    """What vLLM's sampler keeps of a row: temperature, then min-p, then top-k/top-p.

    Returns ``(min_value, threshold)``: :func:`load_values` with ``temp`` and
    ``min_value`` gives the tempered, min-p-masked values, and the tokens whose key is at
    least ``threshold`` are the ones top-k/top-p keep of them. ``temp`` must be positive
    (1 divides nothing), divided as ``DIV`` says (see :func:`divide`); ``min_p`` 0, ``k``
    outside ``[1, V)`` and ``p`` 1 are "none".
    """
    no_min = tl.full((), float("-inf"), tl.float32)
    row_max, row_min = row_stats(x_ptr, vocab, n_tiles, temp, no_min, DIV, BLOCK_V)
    # min-p: vLLM's threshold on the tempered logits; min_p = 0 gives -inf (none).
    # Dividing by a positive temperature keeps the order, so the smallest value left is
    # the tempered minimum, or -inf if min-p masks it.
    min_value = row_max + tl.log(min_p)
    row_min = tl.where(row_min < min_value, float("-inf"), row_min)
    threshold = keep_threshold(
        x_ptr, vocab, n_tiles, temp, min_value, row_max, row_min, k, p,
        DIV, HAS_K, HAS_P, BLOCK_V, PIVOTS,
    )
    return min_value, threshold
