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
        "min_p", "top_k_top_p", "rejection_sample_folded", "rejection_sample_mrv2_folded")
#: The verification families with the sampling parameters folded in (their inputs carry
#: each request's temperature, top-k and top-p; vLLM's side applies them, then verifies).
FOLDED = ("rejection_sample_folded", "rejection_sample_mrv2_folded")
#: V1 verification, plain or folded (``is_greedy`` per request), else Model Runner V2's
#: (greedy as temperature 0 of a request state).
V1_NAMES = ("rejection_sample", "rejection_sample_folded")
PROBLEMS = [
    Problem(spec_len=3, batch=4, vocab=300, dtype="bfloat16", draft_probs=True),
    Problem(spec_len=2, batch=3, vocab=1000, dtype="float32", draft_probs=False),
]


def _greedy(name: str, inputs: Any, mode: str) -> Any:
    """``inputs`` with every request greedy (``"greedy"``) or every other one
    (``"mixed"``); as made (all random) for ``"random"``."""
    if mode == "random":
        return inputs
    if name in V1_NAMES:
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


@pytest.mark.vllm_kernels
@pytest.mark.parametrize("case", ["mixed", "top_p_only", "min_p"])
@pytest.mark.parametrize("name", FOLDED)
def test_folded_verification(name: str, case: str) -> None:
    """vLLM's apply-then-verify on folded inputs: every other request greedy; top-p
    alone (no temperature or top-k folded: V1 divides by 1, MRV2 skips those steps);
    min-p of Model Runner V2 (V1's verification applies none: refused by name)."""
    problem = Problem(spec_len=3, batch=4, vocab=301, dtype="bfloat16", draft_probs=True)
    inputs = get_family(name).make_inputs(problem, seed=11, device="cpu")
    if case == "mixed":
        inputs = _greedy(name, inputs, "mixed")
    elif case == "top_p_only":
        if name in V1_NAMES:
            inputs = dataclasses.replace(inputs, temperature=None, top_k=None)
        else:
            inputs = dataclasses.replace(inputs, temperature=torch.ones_like(
                inputs.temperature), top_k=None)
    else:
        min_p = torch.tensor([0.0, 0.05, 0.3, 1.0]).repeat(
            inputs.temperature.shape[0])[:inputs.temperature.shape[0]]
        inputs = dataclasses.replace(inputs, min_p=min_p)
        if name in V1_NAMES:
            with pytest.raises(IncumbentUnavailable, match="applies no min-p"):
                vllm_incumbent(name, inputs)
            return
    _check(name, inputs)


@pytest.mark.vllm_kernels
@pytest.mark.parametrize("name", ["rejection_sample", "rejection_sample_mrv2", *FOLDED])
def test_verification_with_fly(name: str, vllm_series: str) -> None:
    """vLLM 0.33's FLy window, plain and folded: its functions take it (and V1's FLy
    writes the coins it is handed: the inputs' stay as they were); 0.32's verify
    without FLy, and the incumbent says so."""
    problem = Problem(spec_len=3, batch=3, vocab=257, dtype="float32", draft_probs=True)
    # (A seed whose first decision is no near-tie: a changed token is then refused.)
    inputs = get_family(name).make_inputs(problem, seed=5, device="cpu")
    fly = {"fly_window_size": 1, "fly_entropy_threshold": 0.0, "fly_entropy_top_k": 3}
    if name in V1_NAMES:
        inputs = dataclasses.replace(inputs, **fly)
    else:
        inputs = dataclasses.replace(inputs, **fly, vllm_version=vllm_series)
    if vllm_series == "0.32":
        with pytest.raises(IncumbentUnavailable, match="without FLy windows"):
            vllm_incumbent(name, inputs)
        return
    _check(name, inputs)


def test_unavailable() -> None:
    problem = Problem(spec_len=1, batch=1, vocab=7)
    inputs = get_family("temperature").make_inputs(problem, seed=0, device="cpu")
    with pytest.raises(IncumbentUnavailable, match="unknown kernel family"):
        vllm_incumbent("no_such_family", inputs)
    with pytest.raises(IncumbentUnavailable, match=r"is installed, not 9\.9"):
        vllm_incumbent("temperature", inputs, vllm_version="9.9")
    with pytest.raises(IncumbentUnavailable, match="sample"):
        vllm_incumbent("sample", get_family("sample").make_inputs(problem, seed=0,
                                                                  device="cpu"))
    # The plain and the folded verification families' inputs are not each other's.
    plain = Problem(spec_len=2, batch=2, vocab=64)
    for name, other in (("rejection_sample", "rejection_sample_folded"),
                        ("rejection_sample_mrv2", "rejection_sample_mrv2_folded")):
        with pytest.raises(IncumbentUnavailable, match="with sampling parameters"):
            vllm_incumbent(name, get_family(other).make_inputs(plain, seed=0, device="cpu"))
        with pytest.raises(IncumbentUnavailable, match="without sampling parameters"):
            vllm_incumbent(other, get_family(name).make_inputs(plain, seed=0, device="cpu"))
    series = ".".join(version_on_disk(full=True).split(".")[:2])  # type: ignore[union-attr]
    assert vllm_incumbent("temperature", inputs, vllm_version=series).vllm_version == (
        installed_vllm_version())


def test_installed_version() -> None:
    assert installed_vllm_version() == version_on_disk(full=True)
