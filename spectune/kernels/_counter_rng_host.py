"""vLLM's counter-based random numbers on the host, as the kernels draw them.

The acceptance coin (Triton's ``tl.rand``: Philox 4x32-10, its first output as a
uniform) and the Gumbel noise (MurmurHash3 x86_32 of ``(seed, pos, token)``), in torch
on CPU, for the PyTorch reference and the tests. Transcendental functions (``log``) are
torch's here and the backend's in a kernel: equal to an ulp, which the reference's
near-tie margin covers. Part of no family's source hash (see
:mod:`spectune.kernels._counter_rng` for the kernels' side).
"""

from __future__ import annotations

import torch

from spectune.kernels._counter_rng import (
    COIN_FLOOR,
    MURMUR_C1,
    MURMUR_C2,
    MURMUR_FMIX1,
    MURMUR_FMIX2,
    MURMUR_HIGH_DOMAIN,
    MURMUR_LENGTH,
    MURMUR_N,
    NOISE_SERIES_CUTOFF,
    NOISE_SERIES_DEGREE,
    NOISE_TAIL_FLOOR,
)
from spectune.kernels._philox import philox

__all__ = ["coins", "gumbel_noise"]

_MASK32 = 0xFFFFFFFF
# tl.rand's scale from a non-negative int32 to [0, 1).
_RAND_SCALE = 4.6566127342e-10


def coins(seed: int, pos: torch.Tensor) -> torch.Tensor:
    """``max(tl.rand(seed, pos), COIN_FLOOR)`` for int64 positions, as float32."""
    pos = pos.to(torch.int64)
    bits, _ = philox(seed, pos & _MASK32, (pos >> 32) & _MASK32)
    signed = torch.where(bits >= 2**31, bits - 2**32, bits)
    signed = torch.where(signed < 0, -signed - 1, signed)  # ~x for negative int32
    u = signed.to(torch.float32) * torch.tensor(_RAND_SCALE, dtype=torch.float32)
    return torch.clamp(u, min=COIN_FLOOR.value)


def gumbel_noise(seed: int, pos: int, tokens: torch.Tensor, *, fp64: bool) -> torch.Tensor:
    """Gumbel(0, 1) noise of ``tokens`` at ``(seed, pos)``: float64 if ``fp64``, else float32."""
    tokens = tokens.to(torch.int64)
    if fp64:
        low = _murmur(seed, pos, tokens, 0)
        high = _murmur(seed, pos, tokens, MURMUR_HIGH_DOMAIN.value)
        bits53 = ((high << 21) | (low >> 11)).to(torch.float64)
        u = (bits53 + 0.5) * 2.0**-53
        u = torch.where(u == 1.0, u - 2.0**-53, u)
        return -torch.log(-torch.log(u))
    bits = _murmur(seed, pos, tokens, 0)
    high16 = (bits >> 16).to(torch.float32)
    low16 = (bits & 0xFFFF).to(torch.float32)
    u = high16 * 2.0**-16 + (low16 + 0.5) * 2.0**-32
    p = torch.full_like(u, 1.0 / NOISE_SERIES_DEGREE.value)
    for j in range(NOISE_SERIES_DEGREE.value - 1, 0, -1):
        p = 1.0 / j + u * p
    series = -u * p
    direct = torch.log(torch.clamp(1.0 - u, min=NOISE_TAIL_FLOOR.value))
    log1m = torch.where(u < NOISE_SERIES_CUTOFF.value, series, direct)
    return -torch.log(-log1m)


def _mul32(a: torch.Tensor, m: int) -> torch.Tensor:
    """a * m mod 2**32 for uint32 values in int64, without overflowing int64."""
    low = a * (m & 0xFFFF)
    high = ((a * (m >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _rotl(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def _block(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = _mul32(_rotl(_mul32(k, MURMUR_C1.value), 15), MURMUR_C2.value)
    h = _rotl(h ^ k, 13)
    return (_mul32(h, 5) + MURMUR_N.value) & _MASK32


def _murmur(seed: int, pos: int, tokens: torch.Tensor, domain: int) -> torch.Tensor:
    """MurmurHash3 x86_32 of (seed lo, seed hi, pos lo, token), hash seed ``domain``."""
    seed &= 0xFFFFFFFFFFFFFFFF
    words = (seed & _MASK32, (seed >> 32) & _MASK32, pos & _MASK32)
    h = torch.full_like(tokens, domain)
    for word in words:
        h = _block(h, torch.full_like(tokens, word))
    h = _block(h, tokens & _MASK32)
    h = h ^ MURMUR_LENGTH.value
    h = _mul32(h ^ (h >> 16), MURMUR_FMIX1.value)
    h = _mul32(h ^ (h >> 13), MURMUR_FMIX2.value)
    return h ^ (h >> 16)
