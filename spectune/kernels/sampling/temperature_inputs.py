"""Inputs of the temperature kernel: one launch's arguments, and how to make them.

Not part of the family's source hash.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spectune.kernels._synthetic_inputs import peaked_logits
from spectune.kernels._tensors import DTYPE_BY_NAME
from spectune.space import Problem

__all__ = ["TemperatureInputs", "make_temperature_inputs"]

# Request states beyond those scheduled (vLLM keeps more slots than it schedules).
_SPARE_STATES = 3
# The scheduled requests' temperatures, in turn: mostly scaled rows, with greedy (0) and
# unscaled (1) rows the kernel skips, as in a mixed batch.
_TEMPERATURES = (0.7, 0.0, 1.3, 1.0, 0.5, 0.9, 2.0, 0.2)


@dataclass
class TemperatureInputs:
    """Arguments of one :func:`~spectune.kernels.apply_temperature` call (its parameters'
    names), and the buffer the family's launches write.

    Attributes:
        logits: ``[num_tokens, V]`` logits; the family's launches only read them.
        expanded_idx_mapping: ``[num_tokens]`` request state of each row.
        temperature: ``[max_num_reqs]`` float32 per request state.
        out: ``[num_tokens, V]`` where the family's launches write (``out=``), made as a
            copy of ``logits``: the rows the kernel skips keep the logits' values and
            the others are rewritten from the unchanged logits, so every launch (the
            tuner repeats them) gives the same result. Overwritten by each launch.
    """

    logits: torch.Tensor
    expanded_idx_mapping: torch.Tensor
    temperature: torch.Tensor
    out: torch.Tensor = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.out is None:
            self.out = self.logits.clone()

    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The launcher's positional arguments, in vLLM's order."""
        return self.logits, self.expanded_idx_mapping, self.temperature


def make_temperature_inputs(
    problem: Problem, *, seed: int, device: torch.device | str = "cpu"
) -> TemperatureInputs:
    """Realistic inputs: ``problem.batch`` rows of peaked logits, their requests' temperatures
    in turn from a mix of scaled (the first row among them), greedy and unscaled ones."""
    gen = torch.Generator().manual_seed(seed)
    rows, vocab = problem.batch, problem.vocab
    logits, _ = peaked_logits(rows, vocab, generator=gen)
    states = rows + _SPARE_STATES
    mapping = torch.randperm(states, generator=gen)[:rows]
    temperature = torch.ones(states, dtype=torch.float32)
    temperature[mapping] = torch.tensor(
        [_TEMPERATURES[row % len(_TEMPERATURES)] for row in range(rows)], dtype=torch.float32
    )
    return TemperatureInputs(
        logits=logits.to(DTYPE_BY_NAME[problem.dtype]).to(device),
        expanded_idx_mapping=mapping.to(torch.int32).to(device),
        temperature=temperature.to(device),
    )
