"""Philox4x32-10 on the host, bit for bit as Triton's ``tl.philox`` computes it.

Lets tests and the reference reproduce the random numbers our kernels draw in-kernel.
"""

from __future__ import annotations

import torch

__all__ = ["philox"]

_PHILOX_M0 = 0xD2511F53
_PHILOX_M1 = 0xCD9E8D57
_PHILOX_W0 = 0x9E3779B9
_PHILOX_W1 = 0xBB67AE85
_PHILOX_ROUNDS = 10
_MASK32 = 0xFFFFFFFF


def philox(
    seed: int, c0: torch.Tensor, c1: int | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Philox4x32-10 as Triton computes it (key = seed; counter = (c0, c1, 0, 0)).

    ``c0`` and a tensor ``c1`` keep their low 32 bits. Returns the first two 32-bit
    outputs, as int64 tensors holding uint32 values.
    """
    seed &= 0xFFFFFFFFFFFFFFFF
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    x0 = c0.to(torch.int64) & _MASK32
    if isinstance(c1, torch.Tensor):
        x1 = torch.broadcast_to(c1.to(torch.int64) & _MASK32, x0.shape).clone()
    else:
        x1 = torch.full_like(x0, c1 & _MASK32)
    x2 = torch.zeros_like(x0)
    x3 = torch.zeros_like(x0)
    for _ in range(_PHILOX_ROUNDS):
        hi0, lo0 = _mulhilo(x0, _PHILOX_M0)
        hi2, lo2 = _mulhilo(x2, _PHILOX_M1)
        x0, x1, x2, x3 = (hi2 ^ x1 ^ k0, lo2, hi0 ^ x3 ^ k1, lo0)
        k0 = (k0 + _PHILOX_W0) & _MASK32
        k1 = (k1 + _PHILOX_W1) & _MASK32
    return x0, x1


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of a * m for uint32 a and m, exactly, in int64 arithmetic."""
    a_hi, a_lo = a >> 16, a & 0xFFFF
    m_hi, m_lo = m >> 16, m & 0xFFFF
    lo_lo = a_lo * m_lo
    mid = a_hi * m_lo + a_lo * m_hi + (lo_lo >> 16)
    lo = ((mid & 0xFFFF) << 16) | (lo_lo & 0xFFFF)
    hi = a_hi * m_hi + (mid >> 16)
    return hi & _MASK32, lo & _MASK32
