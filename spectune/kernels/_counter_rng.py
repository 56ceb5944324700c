"""vLLM's counter-based random streams in Triton, bit for bit, for every family that needs them.

vLLM 0.32's Model Runner V2 draws from counters, not from torch generators: the
acceptance coin of a draft at position ``pos`` is Triton's ``tl.rand(seed, pos)``
(Philox 4x32-10) floored at :data:`COIN_FLOOR`; the Gumbel noise of token ``v`` at
``pos`` (its sampler's and its resampling's) is a MurmurHash3 (x86, 32-bit) of
``(seed, pos, v)`` turned into a uniform. Kernels that reproduce them give a seeded
request vLLM's tokens. Host copies for references and tests:
:mod:`spectune.kernels._counter_rng_host`.

Part of the source hash of every family that launches these functions. Kernels read a
module global only if it is a ``tl.constexpr``; host code reads those with ``.value``.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "COIN_FLOOR",
    "DRAFT_NOISE_SALT",
    "MURMUR_C1",
    "MURMUR_C2",
    "MURMUR_FMIX1",
    "MURMUR_FMIX2",
    "MURMUR_HIGH_DOMAIN",
    "MURMUR_LENGTH",
    "MURMUR_N",
    "NOISE_SERIES_CUTOFF",
    "NOISE_SERIES_DEGREE",
    "NOISE_TAIL_FLOOR",
    "coin",
    "gumbel_noise",
    "log1m_series",
    "murmur_block",
    "murmur_noise_bits",
    "rotl32",
]

#: Smallest acceptance coin: ``tl.rand`` can return 0, whose log would accept anything.
COIN_FLOOR = tl.constexpr(4.6566127342e-10)

#: Added to the position of a drafter's own sampling, so that a draft and the residual
#: it may be resampled from never share noise.
DRAFT_NOISE_SALT = tl.constexpr(1 << 30)

# MurmurHash3 x86_32 as vLLM keys its Gumbel noise: four 32-bit words (seed low, seed
# high, position low, token), hash seed 0 (or MURMUR_HIGH_DOMAIN for the high half of a
# 64-bit uniform), length 16 bytes.
#: Block-mixing multipliers and the per-block additive constant.
MURMUR_C1 = tl.constexpr(0xCC9E2D51)
MURMUR_C2 = tl.constexpr(0x1B873593)
MURMUR_N = tl.constexpr(0xE6546B64)
#: Finalisation multipliers.
MURMUR_FMIX1 = tl.constexpr(0x85EBCA6B)
MURMUR_FMIX2 = tl.constexpr(0xC2B2AE35)
#: Bytes hashed (four words), xored in before finalisation.
MURMUR_LENGTH = tl.constexpr(16)
#: Hash seed of the high 32 bits of a float64 uniform.
MURMUR_HIGH_DOMAIN = tl.constexpr(0x9E3779B9)

# float32 noise: g = -log(-log(1 - u)); log(1 - u) by its series below the cutoff (where
# the winning, large-noise tail lives), else directly with 1 - u floored.
#: Below this u, log(1 - u) = -u * sum_{j=0}^{DEGREE-1} u^j / (j + 1).
NOISE_SERIES_CUTOFF = tl.constexpr(0.25)
#: Terms of that series.
NOISE_SERIES_DEGREE = tl.constexpr(8)
#: Floor of 1 - u (2**-24) above the cutoff.
NOISE_TAIL_FLOOR = tl.constexpr(5.960464477539063e-08)


@triton.jit
def rotl32(x, r: tl.constexpr):
    """``x`` (uint32) rotated left by ``r`` bits."""
    return (x << r) | (x >> (32 - r))


@triton.jit
def murmur_block(h, k):
    """One 32-bit block of MurmurHash3 x86_32 folded into the running hash ``h``."""
    k = rotl32(k * MURMUR_C1, 15) * MURMUR_C2
    h = rotl32(h ^ k, 13)
    return h * 5 + MURMUR_N


@triton.jit
def murmur_noise_bits(seed, pos, token, DOMAIN: tl.constexpr):
    """MurmurHash3 x86_32 of the words (seed lo, seed hi, pos lo, token), hash seed DOMAIN."""
    seed = seed.to(tl.int64)
    pos = pos.to(tl.int64)
    # The request's words are scalars; only the token word is a vector.
    h = tl.full((), DOMAIN, tl.uint32)
    h = murmur_block(h, (seed & 0xFFFFFFFF).to(tl.uint32))
    h = murmur_block(h, ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    h = murmur_block(h, (pos & 0xFFFFFFFF).to(tl.uint32))
    h = murmur_block(h, token.to(tl.uint32))
    h = h ^ MURMUR_LENGTH
    h = (h ^ (h >> 16)) * MURMUR_FMIX1
    h = (h ^ (h >> 13)) * MURMUR_FMIX2
    return h ^ (h >> 16)


@triton.jit
def log1m_series(u):
    """log(1 - u), by its power series below NOISE_SERIES_CUTOFF, else directly."""
    p = tl.full(u.shape, 1.0 / NOISE_SERIES_DEGREE, tl.float32)
    for j in tl.static_range(NOISE_SERIES_DEGREE - 1, 0, -1):
        p = 1.0 / j + u * p
    series = -u * p
    direct = tl.log(tl.maximum(1.0 - u, NOISE_TAIL_FLOOR))
    return tl.where(u < NOISE_SERIES_CUTOFF, series, direct)


@triton.jit
def gumbel_noise(seed, pos, token, USE_FP64: tl.constexpr):
    """Gumbel(0, 1) noise of ``token`` at (seed, pos): vLLM's draw, bit for bit."""
    if USE_FP64:
        low = murmur_noise_bits(seed, pos, token, 0).to(tl.uint64)
        high = murmur_noise_bits(seed, pos, token, MURMUR_HIGH_DOMAIN).to(tl.uint64)
        bits53 = ((high << 32) | low) >> 11
        u = (bits53.to(tl.float64) + 0.5) * 1.1102230246251565e-16
        # The largest midpoint rounds up to 1.0: step back inside the open interval.
        u = tl.where(u == 1.0, u - 1.1102230246251565e-16, u)
        return -tl.log(-tl.log(u))
    else:
        bits = murmur_noise_bits(seed, pos, token, 0)
        # Both 16-bit halves convert to float32 exactly; their sum rounds once.
        high16 = (bits >> 16).to(tl.int32).to(tl.float32)
        low16 = (bits & 0xFFFF).to(tl.int32).to(tl.float32)
        u = high16 * 1.52587890625e-05 + (low16 + 0.5) * 2.3283064365386963e-10
        return -tl.log(-log1m_series(u))


@triton.jit
def coin(seed, pos):
    """The acceptance coin of a row: Triton's Philox uniform at (seed, pos), floored."""
    return tl.maximum(tl.rand(seed, pos), COIN_FLOOR)
