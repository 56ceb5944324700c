"""The plain PyTorch reference of temperature scaling, and its exactness rule.

Written from vLLM 0.32's MRV2 ``apply_temperature`` semantics. Each scaled logit is one
float32 division and one store in the logits' dtype; the reference divides correctly
rounded (IEEE) and stores as the device's store rounds: to nearest even on GPUs; under
Triton's interpreter (CPU tensors) a float32 value stored into bfloat16 is truncated
(its cast rounds toward zero; vLLM's kernel run there truncates alike), float16 is
rounded to nearest even.

The rule, per backend:

* under the interpreter (``cpu-interpreter``) the division is numpy's, IEEE: every logit
  must be bit-identical to the reference's;
* on a GPU, Triton compiles float32 ``/`` to NVIDIA's ``div.full.f32``, within
  :data:`TEMPERATURE_DEVICE_ULPS` float32 ulps of the correctly rounded quotient (vLLM's
  kernel divides alike, so ours is bit-identical to vLLM's there, not to PyTorch's):
  a scaled logit agrees when it lies between the quotient stepped that many ulps down
  and up, each stored in the logits' dtype. Rows that are not scaled must be
  bit-identical on every backend.

Not part of the family's source hash.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spectune.identity import CPU_BACKEND, backend_of

__all__ = [
    "TEMPERATURE_DEVICE_ULPS",
    "TemperatureReference",
    "temperature_reference",
    "temperature_results_agree",
]

#: float32 ulps a GPU's division may be off the correctly rounded quotient
#: (``div.full.f32``'s documented bound).
TEMPERATURE_DEVICE_ULPS = 2

# An integer dtype of each float dtype's width: bit patterns compared, so -0.0 != 0.0.
_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
# The bits of a float32 a bfloat16 keeps (sign, exponent, 7 mantissa bits).
_BF16_BITS = -(1 << 16)


@dataclass(frozen=True)
class TemperatureReference:
    """Expected logits ``[num_tokens, V]`` (on CPU, the logits' dtype), and the range each
    logit may take on the backend (``low == high == logits`` where exact)."""

    logits: torch.Tensor
    low: torch.Tensor
    high: torch.Tensor


def temperature_reference(
    logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    *,
    backend: str | None = None,
) -> TemperatureReference:
    """Plain PyTorch ``apply_temperature``, out of place.

    A row is scaled unless its state is ``-1`` (padded) or its temperature is 0 or 1.

    Args:
        logits: ``[num_tokens, V]`` logits (not changed).
        expanded_idx_mapping: ``[num_tokens]`` request state of each row.
        temperature: ``[max_num_reqs]`` float32 per request state.
        backend: Whose rule (see the module docstring); default: that of ``logits``'
            device.
    """
    backend = backend or backend_of(logits.device)
    out = logits.detach().cpu().clone()
    states = expanded_idx_mapping.detach().cpu().to(torch.int64)
    temps = temperature.detach().cpu().float()
    valid = states >= 0
    row_temp = torch.zeros(states.shape, dtype=torch.float32)
    row_temp[valid] = temps[states[valid]]
    scaled = valid & (row_temp != 0.0) & (row_temp != 1.0)
    low, high = out, out
    if bool(scaled.any()):
        truncate = backend == CPU_BACKEND and out.dtype == torch.bfloat16
        quotient = out[scaled].float() / row_temp[scaled, None]
        out[scaled] = _stored(quotient, out.dtype, truncate=truncate)
        low, high = out, out
        if backend != CPU_BACKEND:
            low, high = out.clone(), out.clone()
            down, up = quotient, quotient
            for _ in range(TEMPERATURE_DEVICE_ULPS):
                down = torch.nextafter(down, torch.tensor(-torch.inf))
                up = torch.nextafter(up, torch.tensor(torch.inf))
            low[scaled] = _stored(down, out.dtype, truncate=truncate)
            high[scaled] = _stored(up, out.dtype, truncate=truncate)
    return TemperatureReference(logits=out, low=low, high=high)


def _stored(values: torch.Tensor, dtype: torch.dtype, *, truncate: bool) -> torch.Tensor:
    """float32 ``values`` as a store into ``dtype`` keeps them (to nearest even, or toward
    zero: the 16 low bits dropped, a value bfloat16 holds exactly)."""
    if truncate:
        values = (values.view(torch.int32) & _BF16_BITS).view(torch.float32)
    return values.to(dtype)


def temperature_results_agree(
    expected: TemperatureReference, actual: torch.Tensor
) -> tuple[bool, str]:
    """Whether ``actual`` logits agree with the reference under its backend's rule."""
    got = actual.detach().cpu()
    want = expected.logits
    if got.dtype != want.dtype or got.shape != want.shape:
        return False, f"{got.dtype} {list(got.shape)} != {want.dtype} {list(want.shape)}"
    bits = _BITS[got.dtype]
    wrong = got.view(bits) != want.view(bits)
    loose = expected.low.view(bits) != expected.high.view(bits)
    wrong &= ~(loose & (got >= expected.low) & (got <= expected.high))
    if bool(wrong.any()):
        row, col = (int(i) for i in torch.nonzero(wrong)[0])
        return False, (f"[{row}, {col}]: expected {float(want[row, col])!r}, got "
                       f"{float(got[row, col])!r} ({int(wrong.sum())} differ)")
    return True, ""
