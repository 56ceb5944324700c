"""Inputs of the fused sampler: one launch's arguments, and how to make them.

Not part of the family's source hash.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spectune.kernels._synthetic_inputs import peaked_logits
from spectune.kernels._tensors import DTYPE_BY_NAME
from spectune.space import Problem

__all__ = ["SampleInputs", "make_sample_inputs"]

# Request states beyond those sampled (vLLM keeps more slots than it schedules).
_SPARE_STATES = 3
# Where a decode step of a long-running request sits.
_FIRST_POSITION = 1000
# Common request settings: (temperature, min_p, top_k (0: none), top_p).
_SETTINGS = ((0.8, 0.05, 50, 0.9), (1.0, 0.0, 0, 0.95), (0.7, 0.0, 20, 1.0),
             (1.2, 0.1, 0, 0.8), (0.0, 0.0, 0, 1.0), (0.6, 0.02, 100, 0.99))


@dataclass
class SampleInputs:
    """Arguments of one :func:`~spectune.kernels.sample` call."""

    logits: torch.Tensor
    expanded_idx_mapping: torch.Tensor
    temperature: torch.Tensor
    min_p: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seed: torch.Tensor
    pos: torch.Tensor
    use_fp64: bool = False

    def args(self) -> tuple[torch.Tensor, ...]:
        """The launcher's positional arguments."""
        return (self.logits, self.expanded_idx_mapping, self.temperature, self.min_p,
                self.top_k, self.top_p, self.seed, self.pos)


def make_sample_inputs(
    problem: Problem, *, seed: int, device: torch.device | str = "cpu"
) -> SampleInputs:
    """Realistic inputs: ``problem.batch`` rows of peaked logits, their requests with a
    mix of common sampling settings (one of them greedy)."""
    gen = torch.Generator().manual_seed(seed)
    rows, vocab = problem.batch, problem.vocab
    logits, _ = peaked_logits(rows, vocab, generator=gen)
    states = rows + _SPARE_STATES
    picks = [_SETTINGS[i] for i in torch.randint(0, len(_SETTINGS), (states,),
                                                 generator=gen).tolist()]
    return SampleInputs(
        logits=logits.to(DTYPE_BY_NAME[problem.dtype]).to(device),
        expanded_idx_mapping=torch.randperm(states, generator=gen)[:rows].to(torch.int32)
        .to(device),
        temperature=torch.tensor([s[0] for s in picks], dtype=torch.float32, device=device),
        min_p=torch.tensor([s[1] for s in picks], dtype=torch.float32, device=device),
        top_k=torch.tensor([min(s[2], vocab) or vocab for s in picks], dtype=torch.int32,
                           device=device),
        top_p=torch.tensor([s[3] for s in picks], dtype=torch.float32, device=device),
        seed=torch.randint(0, 2**62, (states,), generator=gen).to(device),
        pos=(_FIRST_POSITION + torch.arange(rows, dtype=torch.int64)).to(device),
    )
