"""Numbers the MRV2 verification kernels and host code must agree on, defined once.

vLLM 0.32's Model Runner V2 draws its random numbers from counters, not from a torch
generator: the acceptance coin of a draft is Triton's ``tl.rand(seed, pos)`` (Philox
4x32-10) floored at :data:`COIN_FLOOR`, and the Gumbel noise of token ``v`` at position
``pos`` is a MurmurHash3 (x86, 32-bit) of ``(seed, pos, v)`` turned into a uniform. The
kernels reproduce both bit for bit, so a seeded request gets vLLM's tokens; the host
reproduction (:mod:`spectune.kernels.rejection_mrv2_random`) reads the same numbers.

Kernels read a module global only if it is a ``tl.constexpr``; host code reads those with
``.value``. Part of the family's source hash (see
:mod:`spectune.kernels.rejection_mrv2_family`).
"""

from __future__ import annotations

import triton.language as tl

__all__ = [
    "COIN_FLOOR",
    "GROUP",
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
    "PLACEHOLDER_TOKEN_ID",
]

#: Output slots past a request's sampled tokens (vLLM leaves them unwritten).
PLACEHOLDER_TOKEN_ID = tl.constexpr(-1)

#: Smallest acceptance coin: ``tl.rand`` can return 0, whose log would accept anything.
COIN_FLOOR = tl.constexpr(4.6566127342e-10)

#: Logits per group of the softmax statistics. A group's max and fixed-point sum are
#: exact whatever the launch config, so the vocabulary tile must be a multiple of it.
GROUP = tl.constexpr(256)

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
