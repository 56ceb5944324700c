"""Shared builders for the kernel tests: random verification problems on CPU."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pytest
import torch

from spectune.kernels.rejection import RejectionInputs

#: Where the kernel tests run: CPU tensors through Triton's interpreter (the default, and
#: CI), or a GPU natively (``SPECTUNE_TEST_DEVICE=cuda``, as scripts/gpu_check.sh does).
DEVICE = torch.device(os.environ.get("SPECTUNE_TEST_DEVICE", "cpu"))

if DEVICE.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.exit("tests/kernels on CPU need TRITON_INTERPRET=1 (scripts/test.sh sets it)",
                returncode=2)


@dataclass(frozen=True)
class Case:
    """A verification problem to build: shapes and which features are on."""

    batch: int
    max_k: int
    vocab: int
    dtype: torch.dtype = torch.float32
    draft_probs: bool = True
    mode: str = "mixed"  # greedy | random | mixed
    zero_drafts: bool = True  # allow requests with no drafts
    seeded: bool = False

    def __str__(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        dp = "dp" if self.draft_probs else "nodp"
        return f"B{self.batch}-k{self.max_k}-V{self.vocab}-{dt}-{dp}-{self.mode}"


def build(case: Case, *, seed: int = 0) -> RejectionInputs:
    """Random inputs for ``case``: peaked logits, drafts drawn near the target."""
    gen = torch.Generator().manual_seed(seed)
    low = 0 if case.zero_drafts else 1
    counts = torch.randint(low, case.max_k + 1, (case.batch,), generator=gen)
    counts[0] = case.max_k  # the longest request always reaches max_spec_len
    cu = torch.cumsum(counts, 0).to(torch.int32)
    n_rows, vocab = int(cu[-1]), case.vocab
    logits = torch.randn(n_rows, vocab, generator=gen) * 2.5
    # Make drafts often right so chains run long: put the draft near the top.
    drafts = torch.randint(0, vocab, (n_rows,), generator=gen)
    boost = torch.rand(n_rows, generator=gen) < 0.7
    logits[torch.arange(n_rows)[boost], drafts[boost]] += 6.0
    draft_probs = None
    if case.draft_probs:
        draft_probs = torch.softmax(logits + torch.randn(n_rows, vocab, generator=gen), dim=-1)
    if case.mode == "greedy":
        is_greedy = None
    elif case.mode == "random":
        is_greedy = torch.zeros(case.batch, dtype=torch.bool)
    else:
        is_greedy = torch.rand(case.batch, generator=gen) < 0.5
    uniform = inv_q = seeds = None
    if is_greedy is not None:
        if case.seeded:
            seeds = torch.randint(-(2**62), 2**62, (case.batch,), generator=gen)
        else:
            uniform = torch.rand(n_rows, generator=gen, dtype=torch.float64)
            inv_q = 1.0 / torch.empty(case.batch, vocab).exponential_(generator=gen)
    return on_device(RejectionInputs(
        draft_token_ids=drafts.to(torch.int32),
        cu_num_draft_tokens=cu,
        target_logits=logits.to(case.dtype),
        bonus_token_ids=torch.randint(0, vocab, (case.batch, 1), generator=gen),
        max_spec_len=case.max_k,
        draft_probs=draft_probs,
        is_greedy=is_greedy,
        uniform_probs=uniform,
        inv_q=inv_q,
        seeds=seeds,
    ))


def on_device(inputs: RejectionInputs, device: torch.device = DEVICE) -> RejectionInputs:
    """``inputs`` with every tensor moved to ``device``."""
    moved = {
        name: value.to(device) if isinstance(value, torch.Tensor) else value
        for name, value in vars(inputs).items()
    }
    return RejectionInputs(**moved)


_T = TypeVar("_T")


def vllm_oracle(load: Callable[[], _T]) -> _T:
    """``load()`` of one of vLLM's functions; a skip when vllm is not installed, except in
    CI, where that is a failure."""
    try:
        return load()
    except ModuleNotFoundError as exc:
        if exc.name != "vllm" or os.environ.get("CI"):
            raise
        pytest.skip("vllm is not installed")


#: Integer views of the logits dtypes, for bit-for-bit comparisons.
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def bits(x: torch.Tensor) -> torch.Tensor:
    """``x`` on the host as integers of the same bits (``-0.0`` differs from ``0.0``)."""
    return x.detach().cpu().view(BITS[x.dtype])


def vllm_state_step(
    fn: Callable[..., None], logits: torch.Tensor, mapping: torch.Tensor,
    values: torch.Tensor,
) -> torch.Tensor:
    """One of MRV2's in-place steps ``fn(logits, expanded_idx_mapping, values)`` run by
    vLLM on a copy of ``logits``; padded rows (state ``-1``, which vLLM's kernels would
    read out of bounds) at an extra state of value 0, which they skip."""
    out = logits.clone()
    padded_values = torch.cat([values, values.new_zeros(1)])
    states = mapping.clone()
    states[states < 0] = padded_values.shape[0] - 1
    fn(out, states, padded_values)
    return out
