"""Inputs of the Gumbel-max sampling kernels: one launch's arguments, and how to make them.

Not part of the family's source hash.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spectune.kernels._synthetic_inputs import peaked_logits
from spectune.kernels._tensors import DTYPE_BY_NAME
from spectune.space import Problem

__all__ = ["GumbelInputs", "make_gumbel_inputs"]

# Request states beyond those sampled (vLLM keeps more slots than it schedules).
_SPARE_STATES = 3
# Where a decode step of a long-running request sits.
_FIRST_POSITION = 1000


@dataclass
class GumbelInputs:
    """Arguments of one :func:`~spectune.kernels.gumbel_sample` call (its parameters'
    names; the logits cache is not part of a tuning problem and is left out)."""

    logits: torch.Tensor
    expanded_idx_mapping: torch.Tensor
    temperature: torch.Tensor
    seed: torch.Tensor
    pos: torch.Tensor
    apply_temperature: bool = True
    is_drafting: bool = False
    use_fp64: bool = False

    def args(self) -> tuple[object, ...]:
        """The launcher's positional arguments, in vLLM's order (no logits cache)."""
        return (
            self.logits, self.expanded_idx_mapping, self.temperature, self.seed, self.pos,
            self.apply_temperature, self.is_drafting, None, None, self.use_fp64,
        )


def make_gumbel_inputs(
    problem: Problem, *, seed: int, device: torch.device | str = "cpu"
) -> GumbelInputs:
    """Realistic inputs: ``problem.batch`` rows of peaked logits, every request at
    temperature 1 (the temperature applied in the kernel, as vLLM's sampler asks)."""
    gen = torch.Generator().manual_seed(seed)
    rows, vocab = problem.batch, problem.vocab
    logits, _ = peaked_logits(rows, vocab, generator=gen)
    states = rows + _SPARE_STATES
    mapping = torch.randperm(states, generator=gen)[:rows]
    return GumbelInputs(
        logits=logits.to(DTYPE_BY_NAME[problem.dtype]).to(device),
        expanded_idx_mapping=mapping.to(torch.int32).to(device),
        temperature=torch.ones(states, dtype=torch.float32, device=device),
        seed=torch.randint(0, 2**62, (states,), generator=gen).to(device),
        pos=(_FIRST_POSITION + torch.arange(rows, dtype=torch.int64)).to(device),
    )
