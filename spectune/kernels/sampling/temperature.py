"""Temperature scaling with Model Runner V2's semantics, tuned.

Semantics and arguments are those of vLLM 0.32's MRV2 ``apply_temperature``
(``vllm/v1/worker/gpu/sample/gumbel.py``): in place, each row's logits become
``float32(logit) / temperature`` of the row's request, stored back in the logits' dtype;
a row whose temperature is 0 (greedy) or 1 is left untouched, as there. A padded row
(request state ``-1``) is left untouched too: vLLM's kernel would read
``temperature[-1]``, outside the tensor; here it reads nothing and writes nothing.

One program per (row, vocab tile), as vLLM launches. Every logit is computed alone, with
vLLM's float32 operations (convert, divide, store), so the results are bit-identical to
vLLM's for every config.

This module makes the family's source hash.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import triton
import triton.language as tl

from spectune.kernels._launch import launch_config
from spectune.kernels._tensors import check_state_rows
from spectune.kernels.sampling.temperature_space import default_config, problem_for, search_space

__all__ = ["apply_temperature"]


@triton.jit
def _temperature_kernel(
    x_ptr, x_stride, out_ptr, out_stride, idx_map_ptr, temp_ptr, vocab,
    BLOCK_V: tl.constexpr,
):
    """One tile of one row: ``out = float32(x) / temperature`` (rows at 0, 1 or padded
    are skipped: nothing is read or written)."""
    row = tl.program_id(0).to(tl.int64)
    state = tl.load(idx_map_ptr + row).to(tl.int64)
    # A padded row (state -1) reads no temperature: 0, skipped like a greedy row.
    temp = tl.load(temp_ptr + state, mask=state >= 0, other=0.0).to(tl.float32)
    if temp == 0.0 or temp == 1.0:
        return
    idx = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    in_vocab = idx < vocab
    x = tl.load(x_ptr + row * x_stride + idx, mask=in_vocab).to(tl.float32)
    tl.store(out_ptr + row * out_stride + idx, x / temp, mask=in_vocab)


def apply_temperature(
    logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: Mapping[str, int] | None = None,
    validate: bool = True,
) -> None:
    """Divide each row's logits by its request's temperature, in place; vLLM 0.32 MRV2.

    Args:
        logits: ``[num_tokens, V]`` float32/bfloat16/float16 (last dim contiguous),
            changed in place.
        expanded_idx_mapping: ``[num_tokens]`` request state of each row (``-1``: a padded
            row, left untouched).
        temperature: ``[max_num_reqs]`` float32 per request state; rows at 0 (greedy) or
            1 are left untouched.
        out: Where the scaled rows are written instead of ``logits`` (same shape and
            dtype, on the same device), which are then only read. Rows the kernel skips
            are not written, so ``out`` should start as a copy of ``logits``. The tuner
            times the in-place kernel this way on unchanging inputs.
        config: Launch configuration (see
            :func:`~spectune.kernels.sampling.temperature_space.search_space`); ``None`` uses the
            default config of the launch's problem.
        validate: Also check what needs the tensors' contents (request states,
            temperatures); callers that guarantee them pass ``False``: no device sync then.

    Raises:
        ValueError: naming the offending argument, before any launch.
    """
    target = check_state_rows(
        logits, expanded_idx_mapping, temperature, out, name="temperature",
        values_ok=lambda t: torch.isfinite(t) & (t >= 0), rule="finite and non-negative",
        validate=validate,
    )
    num_tokens, vocab = logits.shape
    config, launch_opts = launch_config(
        config, logits.device, search_space=search_space, default_config=default_config,
        problem=lambda: problem_for(num_tokens=num_tokens, vocab=vocab, dtype=logits.dtype),
    )
    if num_tokens == 0:
        return
    block = min(config["BLOCK_V"], triton.next_power_of_2(vocab))
    _temperature_kernel[(num_tokens, triton.cdiv(vocab, block))](
        logits, logits.stride(0), target, target.stride(0), expanded_idx_mapping,
        temperature, vocab, BLOCK_V=block, **launch_opts,
    )

