"""The adapter of the ``temperature`` family, temperature scaling (Model Runner V2's
``apply_temperature``): what the tuner and the vLLM plugin run of it (registered in
:data:`spectune.kernels.FAMILIES`, which holds its name, source hash and space)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from spectune.kernels._family import RowsFamily
from spectune.kernels.sampling.temperature import apply_temperature
from spectune.kernels.sampling.temperature_inputs import TemperatureInputs, make_temperature_inputs
from spectune.kernels.sampling.temperature_ref import (
    TemperatureReference,
    temperature_reference,
    temperature_results_agree,
)
from spectune.space import Problem

__all__ = ["TemperatureFamily"]


class TemperatureFamily(RowsFamily):
    """Temperature scaling of logits rows, in place, as a tunable kernel family.

    The kernel works in place; :meth:`launch` writes into the inputs' ``out`` buffer
    instead (same kernel, same memory traffic), so the shared logits never change and
    the tuner's repeated launches all give the reference's result."""

    def make_inputs(
        self, problem: Problem, *, seed: int, device: torch.device | str = "cpu"
    ) -> TemperatureInputs:
        """``problem.batch`` rows at a mix of temperatures (0 and 1 among them)."""
        return make_temperature_inputs(problem, seed=seed, device=device)

    def launch(self, inputs: TemperatureInputs, config: Mapping[str, int]) -> torch.Tensor:
        """The kernel with ``config`` into ``inputs.out``, without the checks that read
        tensor contents; returns ``inputs.out`` (overwritten by the next launch)."""
        apply_temperature(*inputs.args(), out=inputs.out, config=config,
                                      validate=False)
        return inputs.out

    def reference(self, inputs: TemperatureInputs) -> TemperatureReference:
        """The PyTorch reference's logits, and the range each may take on the inputs'
        backend."""
        return temperature_reference(*inputs.args())

    def same(self, expected: TemperatureReference | torch.Tensor, actual: torch.Tensor) -> bool:
        """Bit-identical logits; against a reference, under its backend's rule (bit-identical
        under the interpreter, a GPU's division ulps apart on GPUs)."""
        if isinstance(expected, TemperatureReference):
            return temperature_results_agree(expected, actual)[0]
        bits = torch.int32 if actual.dtype == torch.float32 else torch.int16
        return (expected.dtype == actual.dtype and expected.shape == actual.shape
                and torch.equal(expected.cpu().view(bits), actual.cpu().view(bits)))
