"""Inputs of the rejection-sampling kernels: one launch's arguments, and how to make them.

:class:`RejectionInputs` bundles one launch's arguments; :func:`make_inputs` builds
realistic ones for a tuning problem; :func:`draw_random_inputs` computes on the host the
random numbers the kernels draw from ``seeds``. Not part of the family's source hash:
nothing here decides the kernels' tokens or timings for given inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from spectune.kernels._philox import philox
from spectune.kernels._synthetic_inputs import peaked_logits
from spectune.kernels._tensors import DTYPE_BY_NAME
from spectune.kernels.rejection.rejection_sample_constants import (
    COIN_HIGH_SHIFT,
    COIN_LOW_SHIFT,
    COIN_SCALE,
    COIN_STREAM,
    EXPONENTIAL_FLOOR,
    EXPONENTIAL_SCALE,
    EXPONENTIAL_SHIFT,
    EXPONENTIAL_STREAM,
)
from spectune.space import Problem

__all__ = ["RejectionInputs", "draw_random_inputs", "make_inputs"]

# Not frozen: the vLLM router builds one per verification call, and a frozen dataclass
# costs about 2.5 us more to build (object.__setattr__ per field). Treat it as read-only
# (``dataclasses.replace`` makes a changed copy).
@dataclass
class RejectionInputs:
    """Arguments of one :func:`~spectune.kernels.rejection_sample` call.

    What the tuner passes around and the vLLM router builds from vLLM's arguments; the
    fields are the launcher's arguments of the same names.
    """

    draft_token_ids: torch.Tensor
    cu_num_draft_tokens: torch.Tensor
    target_logits: torch.Tensor
    bonus_token_ids: torch.Tensor
    max_spec_len: int
    draft_probs: torch.Tensor | None = None
    is_greedy: torch.Tensor | None = None
    uniform_probs: torch.Tensor | None = None
    inv_q: torch.Tensor | None = None
    seeds: torch.Tensor | None = None
    temperature: torch.Tensor | None = None
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None
    fly_window_size: int | None = None
    fly_entropy_threshold: float | None = None
    fly_entropy_top_k: int = 3

    def kwargs(self) -> dict[str, Any]:
        """The launcher's keyword arguments."""
        return {
            "max_spec_len": self.max_spec_len,
            "draft_probs": self.draft_probs,
            "is_greedy": self.is_greedy,
            "uniform_probs": self.uniform_probs,
            "inv_q": self.inv_q,
            "seeds": self.seeds,
            **self.sampling_kwargs(),
            **self.fly_kwargs(),
        }

    def fly_kwargs(self) -> dict[str, Any]:
        """vLLM 0.33's FLy arguments, when a window is set (none otherwise: without FLy
        the launch and the reference take none)."""
        if self.fly_window_size is None:
            return {}
        return {"fly_window_size": self.fly_window_size,
                "fly_entropy_threshold": self.fly_entropy_threshold,
                "fly_entropy_top_k": self.fly_entropy_top_k}

    def sampling_kwargs(self) -> dict[str, torch.Tensor]:
        """The sampling parameters to fold (only those given: none for plain
        verification, whose PyTorch reference takes none)."""
        given = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                 "min_p": self.min_p}
        return {name: value for name, value in given.items() if value is not None}

    def args(self) -> tuple[torch.Tensor, ...]:
        """The launcher's positional arguments."""
        return (
            self.draft_token_ids, self.cu_num_draft_tokens, self.target_logits,
            self.bonus_token_ids,
        )


def make_inputs(
    problem: Problem, *, seed: int, device: torch.device | str = "cpu"
) -> RejectionInputs:
    """Realistic inputs for ``problem``: every request random, with ``k`` drafts.

    Drafts are sampled from a drafter close to the target; coins and exponentials are
    drawn on the host.

    Args:
        problem: Shape, logits dtype and whether the drafter gives probabilities.
        seed: Seed of every random draw (the same seed gives the same inputs).
        device: Where the tensors go.
    """
    gen = torch.Generator().manual_seed(seed)
    batch, k, vocab = problem.batch, problem.spec_len, problem.vocab
    n_rows = batch * k
    logits, draft_logits = peaked_logits(n_rows, vocab, generator=gen)
    draft_probs = torch.softmax(draft_logits, dim=-1)
    drafts = torch.multinomial(draft_probs, 1, generator=gen).flatten()
    cu = torch.arange(1, batch + 1, dtype=torch.int32) * k
    inv_q = 1.0 / torch.empty(batch, vocab).exponential_(generator=gen)
    return RejectionInputs(
        draft_token_ids=drafts.to(torch.int32).to(device),
        cu_num_draft_tokens=cu.to(device),
        target_logits=logits.to(DTYPE_BY_NAME[problem.dtype]).to(device),
        bonus_token_ids=torch.randint(0, vocab, (batch, 1), generator=gen).to(device),
        max_spec_len=k,
        draft_probs=draft_probs.to(device) if problem.draft_probs else None,
        is_greedy=torch.zeros(batch, dtype=torch.bool, device=device),
        uniform_probs=torch.rand(n_rows, generator=gen, dtype=torch.float64).to(device),
        inv_q=inv_q.to(device),
    )


def draw_random_inputs(
    seeds: torch.Tensor, cu_num_draft_tokens: torch.Tensor, *, vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The coins and exponentials the kernels draw for ``seeds``, computed on the host.

    Args:
        seeds: ``[B]`` int64 per-request seeds.
        cu_num_draft_tokens: ``[B]`` inclusive cumulative draft counts.
        vocab: Vocabulary size.

    Returns:
        ``(uniform_probs [N] float64, inv_q [B, V] float32)`` such that passing them
        instead of ``seeds`` gives the same tokens (up to the device's ``log``).
    """
    seeds_list = [int(s) for s in seeds.cpu()]
    cu = [int(c) for c in cu_num_draft_tokens.cpu()]
    n_rows = cu[-1] if cu else 0
    uniform = torch.empty(n_rows, dtype=torch.float64)
    inv_q = torch.empty((len(seeds_list), vocab), dtype=torch.float32)
    start = 0
    vocab_idx = torch.arange(vocab, dtype=torch.int64)
    for req, seed in enumerate(seeds_list):
        end = cu[req]
        if end > start:
            positions = torch.arange(end - start, dtype=torch.int64)
            a, b = philox(seed, positions, COIN_STREAM.value)
            bits = (a << COIN_HIGH_SHIFT.value) | (b >> COIN_LOW_SHIFT.value)
            uniform[start:end] = (bits.to(torch.float64) + 0.5) * COIN_SCALE.value
        a, _ = philox(seed, vocab_idx, EXPONENTIAL_STREAM.value)
        u = ((a >> EXPONENTIAL_SHIFT.value).to(torch.float32) + 0.5) * EXPONENTIAL_SCALE.value
        q = torch.clamp(-torch.log(u), min=EXPONENTIAL_FLOOR.value)
        inv_q[req] = 1.0 / q
        start = end
    return uniform, inv_q
