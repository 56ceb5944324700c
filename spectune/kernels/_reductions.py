"""What several kernel families launch: exact max/argmax over a row, and how a row is cut.

``split_row`` is host code, but it decides every launch grid, so it is hashed with them.

Part of the source hash of every family that uses them (see each ``*_family.py``).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "argmax_of_parts",
    "chunk_first_max",
    "chunk_max",
    "first_max",
    "first_max_of_parts",
    "later_wins",
    "split_row",
]


@triton.jit
def chunk_max(x_ptr, lo, vocab, n_tiles, BLOCK_V: tl.constexpr):
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
def argmax_of_parts(value_ptr, index_ptr, row, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr):
    """Reduce per-split (value, index) partials of a row; the lowest split wins ties."""
    offs = tl.arange(0, BLOCK_S)
    values = tl.load(value_ptr + row * SPLITS + offs, mask=offs < SPLITS, other=float("-inf"))
    _, which = tl.max(values, axis=0, return_indices=True)
    return tl.load(index_ptr + row * SPLITS + which)


# NaN-first max and argmax: torch.argmax's order, which vLLM's greedy verification is
# (the verification kernels, V1 and MRV2).


@triton.jit
def first_max(x, BLOCK: tl.constexpr):
    """Max of a tile and the first lane holding it, in torch.argmax's order: a NaN is above
    everything (the first NaN wins), ties keep the first lane.

    tl.max never sees a NaN: with one, a GPU's reduction order would decide the result
    (and the interpreter's nanargmax fails on an all-NaN tile). The NaN search runs only
    when the tile holds +inf or NaN."""
    nan = x != x
    value, lane = tl.max(tl.where(nan, float("inf"), x), axis=0, return_indices=True)
    if value == float("inf"):
        first_nan = tl.min(tl.where(nan, tl.arange(0, BLOCK), BLOCK), axis=0)
        found = first_nan < BLOCK
        value = tl.where(found, float("nan"), value)
        lane = tl.where(found, first_nan, lane)
    return value, lane


@triton.jit
def later_wins(value, best):
    """Whether a later tile's or split's max replaces the running one (torch.argmax's
    order): nothing replaces a NaN, a NaN replaces anything else, ties keep the earlier."""
    return (best == best) & ((value != value) | (value > best))


@triton.jit
def chunk_first_max(x_ptr, lo, vocab, n_tiles, BLOCK_V: tl.constexpr):
    """Max of x[lo : lo + n_tiles * BLOCK_V] (clipped to vocab) and its first index, NaN
    first: ``torch.argmax``, which vLLM's greedy verification is."""
    offs = tl.arange(0, BLOCK_V)
    best = tl.full((), float("-inf"), tl.float32)
    best_idx = lo.to(tl.int32)
    for t in range(n_tiles):
        idx = lo + t * BLOCK_V + offs
        x = tl.load(x_ptr + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
        tile_max, tile_arg = first_max(x, BLOCK_V)
        if later_wins(tile_max, best):
            best = tile_max
            best_idx = (lo + t * BLOCK_V + tile_arg).to(tl.int32)
    return best, best_idx


@triton.jit
def first_max_of_parts(value_ptr, index_ptr, row, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr):
    """The index of a row's max from its per-split partials, NaN first; ties: lowest split."""
    offs = tl.arange(0, BLOCK_S)
    values = tl.load(value_ptr + row * SPLITS + offs, mask=offs < SPLITS, other=float("-inf"))
    _, which = first_max(values, BLOCK_S)
    return tl.load(index_ptr + row * SPLITS + which)


def split_row(
    vocab: int, block: int, splits: int, *, min_block: int = 1
) -> tuple[int, int, int, int]:
    """How a row of ``vocab`` logits is cut for a tile size and a wanted split count.

    The tile is capped at the row's power of two (but kept at least ``min_block``), and no
    split is left without a tile.

    Returns:
        ``(tile, tiles per split, splits, chunk)``; ``chunk`` = tiles per split * tile.
    """
    block = min(block, max(triton.next_power_of_2(vocab), min_block))
    tiles = triton.cdiv(vocab, block)
    per_split = triton.cdiv(tiles, min(splits, tiles))
    return block, per_split, triton.cdiv(tiles, per_split), per_split * block
