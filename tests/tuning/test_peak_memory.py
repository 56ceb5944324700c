"""Peak device memory of one call, beside the time measured against vLLM's function.

Under the CPU interpreter there is no device memory: nothing is measured (and the call
is not made). On a GPU (skipped here without one) a call allocating 4 MiB peaks at 4 MiB.
"""

from __future__ import annotations

import pytest
import torch

from spectune.kernels import get_family
from spectune.space import Problem
from spectune.tuning import peak_memory_mib
from spectune.tuning._vs_vllm import inputs_device


def test_nothing_is_measured_off_a_gpu() -> None:
    calls = []
    assert peak_memory_mib(lambda: calls.append(1), device="cpu") is None
    assert peak_memory_mib(lambda: calls.append(1), device=None) is None
    assert peak_memory_mib(lambda: calls.append(1), device=torch.device("cpu")) is None
    assert calls == []


def test_the_inputs_name_their_device() -> None:
    family = get_family("rejection_sample_mrv2")
    problem = Problem(spec_len=1, batch=1, vocab=300, dtype="float32", draft_probs=True)
    assert inputs_device(family.make_inputs(problem, seed=0)) == torch.device("cpu")
    assert inputs_device(object()) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or HIP device")
def test_a_call_allocating_4_mib_peaks_at_4_mib() -> None:
    kept = torch.ones(1 << 20, device="cuda")  # allocated before: not the call's
    peak = peak_memory_mib(lambda: torch.empty(1 << 20, device="cuda").fill_(1.0),
                           device=kept.device)
    assert peak == pytest.approx(4.0)
    # Scratch freed inside the call counts too: the peak, not what is left.
    assert peak_memory_mib(lambda: torch.empty(2 << 20, device="cuda").sum(),
                           device="cuda") == pytest.approx(8.0, abs=0.01)
