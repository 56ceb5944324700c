"""Numbers the rejection-sampling kernels and the host code must agree on, defined once.

The kernels read a module global only if it is a ``tl.constexpr`` (Triton refuses any
other), so the values the kernels read are ``tl.constexpr``: host code reads them with
``.value``. The others are plain Python numbers. This module is part of the family's
source hash (see :mod:`spectune.kernels.rejection.rejection_sample_family`).
"""

from __future__ import annotations

import triton.language as tl

__all__ = [
    "COIN_HIGH_SHIFT",
    "COIN_LOW_SHIFT",
    "COIN_SCALE",
    "COIN_STREAM",
    "EXPONENTIAL_FLOOR",
    "EXPONENTIAL_SCALE",
    "EXPONENTIAL_SHIFT",
    "EXPONENTIAL_STREAM",
    "FIXED_POINT_BITS",
    "MAX_VOCAB",
    "PLACEHOLDER_TOKEN_ID",
]

#: Output slots where nothing was emitted (after a request's first rejection).
PLACEHOLDER_TOKEN_ID = tl.constexpr(-1)

#: Fractional bits of the fixed-point softmax denominator.
FIXED_POINT_BITS = 42
#: Largest vocabulary whose fixed-point denominator cannot overflow int64:
#: every term is at most 1, so V * 2**FIXED_POINT_BITS < 2**63.
MAX_VOCAB = 2 ** (63 - FIXED_POINT_BITS) - 1

# Random streams. Each draw is Philox4x32-10 keyed by the request's seed, with counter
# (index, stream, 0, 0): the coin of draft position ``index`` on stream COIN_STREAM, the
# exponential of vocabulary index ``index`` on stream EXPONENTIAL_STREAM.

#: Philox stream (second counter word) of the acceptance coins.
COIN_STREAM = tl.constexpr(1)
#: Philox stream of the exponential draws of the recovered-token argmax.
EXPONENTIAL_STREAM = tl.constexpr(0)

# A coin has 52 random bits, all a float64 mantissa holds: the 32 bits of Philox output
# 0 above the top 20 bits of output 1; (bits + 0.5) / 2**52 lies strictly inside (0, 1).
_COIN_BITS = 52
#: Left shift of Philox output 0 within a coin's bits.
COIN_HIGH_SHIFT = tl.constexpr(_COIN_BITS - 32)
#: Right shift of Philox output 1 that keeps its top bits.
COIN_LOW_SHIFT = tl.constexpr(64 - _COIN_BITS)
#: 2**-52: a coin's bits to a float64 in (0, 1).
COIN_SCALE = tl.constexpr(1.0 / 2.0**_COIN_BITS)

# An exponential's uniform has 23 random bits (top of Philox output 0), plus one half:
# strictly inside (0, 1) and exact in float32.
_EXPONENTIAL_BITS = 23
#: Right shift of Philox output 0 that keeps its top bits.
EXPONENTIAL_SHIFT = tl.constexpr(32 - _EXPONENTIAL_BITS)
#: 2**-23: an exponential's bits to a float32 in (0, 1).
EXPONENTIAL_SCALE = tl.constexpr(1.0 / 2.0**_EXPONENTIAL_BITS)
#: Smallest normal float32. An approximate log may round -log(u) to 0 for u next to 1;
#: clamping there keeps 0 * inv_q at 0 (the draw keeps its meaning: a near-zero
#: exponential).
EXPONENTIAL_FLOOR = tl.constexpr(1.1754943508222875e-38)
