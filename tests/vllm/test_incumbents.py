"""The incumbents: the installed vLLM's own functions run on spectune's family inputs
(:func:`spectune.vllm.vllm_incumbent`), what a sweep measures beside spectune's kernels.

Each family's default-config launch must agree with vLLM's function on the same inputs,
and a changed token (or logit) must not; ``run()`` must leave the inputs as they were.
Marked ``vllm_kernels``: also run against vLLM 0.33's sources (``SPECTUNE_VLLM_TREE``),
whose semantics differ for some families; ``agrees`` must hold under both.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from spectune.kernels import get_family
from spectune.space import Problem
from spectune.vllm import (
    Incumbent,
    IncumbentUnavailable,
    installed_vllm_version,
    vllm_incumbent,
)
from tests.conftest import installed_vllm_version as version_on_disk
from tests.vllm.conftest import needs_kernels

pytestmark = [
    pytest.mark.vllm,
    needs_kernels,
    # numpy's warnings from the interpreter evaluating both sides of a tl.where.
    pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning"),
]

BACKEND = "cpu-interpreter"
DONE = ("rejection_sample", "rejection_sample_mrv2", "gumbel_sample", "temperature",
        "min_p", "top_k_top_p")
PROBLEMS = [
    Problem(spec_len=3, batch=4, vocab=300, dtype="bfloat16", draft_probs=True),
    Problem(spec_len=2, batch=3, vocab=1000, dtype="float32", draft_probs=False),
]


def _greedy(name: str, inputs: Any, mode: str) -> Any:
    """``inputs`` with every request greedy (``"greedy"``) or every other one
    (``"mixed"``); as made (all random) for ``"random"``."""
    if mode == "random":
        return inputs
    if name == "rejection_sample":
        batch = inputs.cu_num_draft_tokens.shape[0]
        mixed = torch.arange(batch) % 2 == 0
        return dataclasses.replace(inputs, is_greedy=None if mode == "greedy" else mixed)
    temperature = inputs.temperature.clone()
    states = inputs.idx_mapping.long()
    temperature[states if mode == "greedy" else states[::2]] = 0.0
    return dataclasses.replace(inputs, temperature=temperature)


def _snapshot(inputs: Any) -> dict[str, Any]:
    return {key: value.clone() if isinstance(value, torch.Tensor) else value
            for key, value in vars(inputs).items() if key != "out"}


def _changed(ours: Any) -> Any:
    """``ours`` with one token (or one kept logit) changed."""
    if isinstance(ours, tuple):  # MRV2: (sampled, counts)
        return (_changed(ours[0]), ours[1])
    wrong = ours.clone()
    if wrong.is_floating_point():
        row, col = (torch.isfinite(wrong.float()) & (wrong != 0)).nonzero()[0].tolist()
        wrong[row, col] += 1.0
    else:
        flat = wrong.view(-1)
        flat[0] = flat[0] + 1 if flat[0] >= 0 else 0
    return wrong


def _check(name: str, inputs: Any) -> Incumbent:
    family = get_family(name)
    incumbent = vllm_incumbent(name, inputs)
    assert incumbent.family == name
    assert incumbent.vllm_version == installed_vllm_version()
    assert incumbent.function.startswith("vllm.")
    before = _snapshot(inputs)
    theirs = incumbent.run()
    after = _snapshot(inputs)
    for key, value in before.items():
        same = torch.equal(value, after[key]) if isinstance(value, torch.Tensor) else (
            value == after[key])
        assert same, f"run() changed the inputs' {key}"
    ours = family.launch(inputs, family.default_config(family.problem_of(inputs), BACKEND))
    assert incumbent.agrees(ours, theirs), (incumbent.function, ours, theirs)
    assert not incumbent.agrees(_changed(ours), theirs)
    return incumbent


@pytest.mark.vllm_kernels
@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"V{p.vocab}-{p.dtype}")
@pytest.mark.parametrize("name", DONE)
def test_agrees_with_vllm(name: str, problem: Problem) -> None:
    inputs = get_family(name).make_inputs(problem, seed=problem.vocab, device="cpu")
    _check(name, inputs)


@pytest.mark.vllm_kernels
@pytest.mark.parametrize("mode", ["greedy", "mixed"])
@pytest.mark.parametrize("name", ["rejection_sample", "rejection_sample_mrv2"])
def test_greedy_verification(name: str, mode: str) -> None:
    problem = Problem(spec_len=4, batch=5, vocab=301, dtype="float16", draft_probs=True)
    inputs = get_family(name).make_inputs(problem, seed=7, device="cpu")
    _check(name, _greedy(name, inputs, mode))


@pytest.mark.vllm_kernels
def test_random_verification_from_seeds() -> None:
    """V1 inputs that carry seeds (the fused random numbers) instead of coins."""
    problem = Problem(spec_len=2, batch=3, vocab=257, dtype="float32", draft_probs=True)
    inputs = get_family("rejection_sample").make_inputs(problem, seed=3, device="cpu")
    seeded = dataclasses.replace(inputs, uniform_probs=None, inv_q=None,
                                 seeds=torch.tensor([5, 2**40 + 1, -9]))
    _check("rejection_sample", seeded)


def test_unavailable() -> None:
    problem = Problem(spec_len=1, batch=1, vocab=7)
    inputs = get_family("temperature").make_inputs(problem, seed=0, device="cpu")
    with pytest.raises(IncumbentUnavailable, match="unknown kernel family"):
        vllm_incumbent("no_such_family", inputs)
    with pytest.raises(IncumbentUnavailable, match=r"is installed, not 9\.9"):
        vllm_incumbent("temperature", inputs, vllm_version="9.9")
    for name in ("sample", "rejection_sample_folded", "rejection_sample_mrv2_folded"):
        with pytest.raises(IncumbentUnavailable, match=name):
            vllm_incumbent(name, get_family(name).make_inputs(problem, seed=0, device="cpu"))
    series = ".".join(version_on_disk(full=True).split(".")[:2])  # type: ignore[union-attr]
    assert vllm_incumbent("temperature", inputs, vllm_version=series).vllm_version == (
        installed_vllm_version())


def test_installed_version() -> None:
    assert installed_vllm_version() == version_on_disk(full=True)
