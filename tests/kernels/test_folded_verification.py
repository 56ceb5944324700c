"""Verification with the sampling parameters folded in: the tokens of applying them first.

Both verification families can read raw target logits and apply each request's
temperature, min-p, top-k and top-p to every value they load. The rule held here: the
folded tokens are bit for bit (``torch.equal``) those of the chain they replace, the
parameters applied first (:func:`~spectune.kernels.rejection.process_v1`,
:func:`~spectune.kernels.rejection_mrv2.process_mrv2`) and the unfolded kernel run on the processed
rows. Also: every config of the folded spaces gives the same tokens, folding changes
tokens where it should (so the comparisons can fail), the two folded families' adapters
are consistent, and bad parameters are refused by name.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch

from spectune.identity import backend_of
from spectune.kernels import FAMILIES, get_family, rejection_sample, rejection_sample_mrv2
from spectune.kernels.rejection import (
    RejectionInputs,
    draw_sampling_params,
    process_v1,
    unfolded_v1,
)
from spectune.kernels.rejection_mrv2 import Mrv2Inputs, process_mrv2, unfolded_mrv2
from spectune.space import Problem, SearchSpace
from tests.kernels.conftest import DEVICE, Case, build, on_device
from tests.kernels.mrv2_cases import Mrv2Case, build_mrv2, output_lists

pytestmark = pytest.mark.filterwarnings(
    # numpy's warnings from the interpreter evaluating both sides of a tl.where.
    "ignore:.*encountered in:RuntimeWarning"
)

BACKEND = backend_of(DEVICE)
V1_FOLDED = get_family("rejection_sample_folded")
MRV2_FOLDED = get_family("rejection_sample_mrv2_folded")
_F32, _BF16, _F16 = torch.float32, torch.bfloat16, torch.float16

# Per-request parameter values a batch cycles through (each case starts at its own
# offset, so small batches see different ones): every edge of each parameter's range.
_TEMPERATURES = (1e-3, 0.05, 0.5, 1.0, 2.5, 10.0)
_TOP_PS = (1e-4, 0.5, 0.9, 1.0)
_MIN_PS = (0.0, 0.02, 0.3, 1.0)
#: Which parameters a case folds: ``all``; all but min-p; temperature only; top-k only
#: (V1: no temperature, MRV2: with its temperature); top-p and min-p only.
PARAM_KINDS = ("all", "no_min_p", "temp", "top_k", "top_p_min_p")
#: What a case does to the logits besides its shape: nothing, ``ties`` (values on a
#: coarse grid: ties at every top-k boundary), ``neginf`` (about half of each row at
#: ``-inf``, never its argmax, and one row finite at one token only).
LOGIT_KINDS = ("", "ties", "neginf")


def _cycle(values: tuple[float, ...], count: int, offset: int) -> list[float]:
    return [values[(i + offset) % len(values)] for i in range(count)]


def _top_ks(vocab: int, count: int, offset: int, dtype: torch.dtype) -> torch.Tensor:
    """top-k values: 1, V (none), above V (none), 0 and negative (none), and inside."""
    values = (1, vocab, vocab + 7, 0, -2, max(1, vocab // 3), min(2, vocab))
    return torch.tensor(_cycle(values, count, offset), dtype=dtype)


def _params(kind: str, count: int, vocab: int, offset: int) -> dict[str, torch.Tensor]:
    """``count`` requests' (or request states') parameters for ``kind`` (CPU tensors;
    no temperature: the callers set it)."""
    top_k = _top_ks(vocab, count, offset, torch.int64 if offset % 2 else torch.int32)
    top_p = torch.tensor(_cycle(_TOP_PS, count, offset), dtype=torch.float32)
    min_p = torch.tensor(_cycle(_MIN_PS, count, offset + 1), dtype=torch.float32)
    return {
        "all": {"top_k": top_k, "top_p": top_p, "min_p": min_p},
        "no_min_p": {"top_k": top_k, "top_p": top_p},
        "temp": {},
        "top_k": {"top_k": top_k},
        "top_p_min_p": {"top_p": top_p, "min_p": min_p},
    }[kind]


def _shape_logits(logits: torch.Tensor, kind: str, gen: torch.Generator) -> torch.Tensor:
    """``logits`` (any float dtype, CPU) changed as ``kind`` says (:data:`LOGIT_KINDS`)."""
    rows, vocab = logits.shape
    if kind == "ties":
        return (torch.randint(0, 4, (rows, vocab), generator=gen).float() * 1.5).to(
            logits.dtype)
    if kind == "neginf" and rows and vocab > 1:
        masked = torch.rand(rows, vocab, generator=gen) < 0.5
        masked.scatter_(1, logits.float().argmax(dim=-1, keepdim=True), False)
        logits = logits.masked_fill(masked, float("-inf"))
        logits[rows // 2] = float("-inf")
        logits[rows // 2, vocab // 2] = 1.0
    return logits


def _moved(inputs: Any) -> Any:
    """``inputs`` (either dataclass) with every tensor on :data:`DEVICE`."""
    moved = {name: value.to(DEVICE) if isinstance(value, torch.Tensor) else value
             for name, value in vars(inputs).items()}
    return type(inputs)(**moved)


# --------------------------------------------------------------------------------------
# V1: folded == parameters applied first, then the unfolded kernel
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class V1Fold:
    """A V1 batch (:class:`~tests.kernels.conftest.Case`) and what it folds."""

    case: Case
    params: str = "all"
    logits: str = ""
    seed: int = 0

    def __str__(self) -> str:
        parts = [str(self.case)] + ["seeded"] * self.case.seeded + [self.params]
        return "-".join([*parts, *[self.logits] * bool(self.logits), f"s{self.seed}"])


def build_v1(fold: V1Fold) -> RejectionInputs:
    """The case's raw inputs with its parameters; greedy requests at temperature 0 or
    at a temperature they ignore, random ones at a positive one."""
    inputs = build(fold.case, seed=fold.seed)
    gen = torch.Generator().manual_seed(1000 + fold.seed)
    batch, vocab = fold.case.batch, fold.case.vocab
    logits = _shape_logits(inputs.target_logits.cpu(), fold.logits, gen)
    params = _params(fold.params, batch, vocab, fold.seed)
    if fold.params in ("all", "no_min_p", "temp"):
        temperature = torch.tensor(_cycle(_TEMPERATURES, batch, fold.seed))
        if inputs.is_greedy is not None:
            greedy = inputs.is_greedy.cpu()
            temperature[greedy & (torch.arange(batch) % 2 == 0)] = 0.0
        params["temperature"] = temperature.float()
    return on_device(replace(inputs, target_logits=logits, **params))


def run_v1(inputs: RejectionInputs, config: dict[str, int] | None = None) -> torch.Tensor:
    return rejection_sample(*inputs.args(), **inputs.kwargs(), config=config).cpu()


def raw_v1(inputs: RejectionInputs) -> RejectionInputs:
    """``inputs`` without their parameters: the raw logits verified as they are."""
    return replace(inputs, temperature=None, top_k=None, top_p=None, min_p=None)


V1_CASES = [
    V1Fold(Case(1, 1, 1), seed=1),
    V1Fold(Case(3, 2, 2, _BF16), seed=2),
    V1Fold(Case(5, 3, 7, _F16, draft_probs=False, mode="random"), seed=3),
    V1Fold(Case(7, 3, 517, mode="mixed"), seed=4),
    V1Fold(Case(7, 1, 517, _BF16, draft_probs=False, seeded=True), "no_min_p", seed=5),
    V1Fold(Case(5, 3, 1000, _F16, mode="random"), "temp", seed=6),
    V1Fold(Case(4, 3, 1000, draft_probs=False), "top_k", seed=7),
    V1Fold(Case(5, 2, 1000, _BF16, mode="random", seeded=True), "top_p_min_p", seed=8),
    V1Fold(Case(3, 2, 4099, _BF16), seed=9),
    V1Fold(Case(3, 3, 4099, draft_probs=False, mode="random", seeded=True), seed=10),
    V1Fold(Case(4, 3, 129, mode="greedy"), seed=11),
    V1Fold(Case(7, 3, 300), logits="ties", seed=12),
    V1Fold(Case(5, 2, 1000, _F16, draft_probs=False, mode="random"), "no_min_p", "ties", 13),
    V1Fold(Case(5, 3, 517, seeded=True), logits="neginf", seed=14),
    V1Fold(Case(4, 2, 1000, _BF16, mode="random"), "top_p_min_p", "neginf", seed=15),
    V1Fold(Case(2, 2, 32000), seed=16),
]


def test_v1_cases_cover_the_parameters() -> None:
    """Across the cases: requests without drafts, greedy requests at temperature 0,
    every top-k/top-p/min-p edge, every dtype, both random-number sources."""
    zero_drafts = greedy_at_zero = False
    top_ks: set[str] = set()
    top_ps: set[float] = set()
    min_ps: set[float] = set()
    for fold in V1_CASES:
        inputs = build_v1(fold)
        cu = inputs.cu_num_draft_tokens.cpu().long()
        counts = torch.diff(cu, prepend=cu.new_zeros(1))
        zero_drafts |= bool((counts == 0).any())
        if inputs.is_greedy is not None and inputs.temperature is not None:
            greedy_at_zero |= bool(((inputs.temperature == 0) & inputs.is_greedy).any())
        vocab = fold.case.vocab
        for k in (inputs.top_k.cpu().tolist() if inputs.top_k is not None else []):
            top_ks.add("none" if k >= vocab or k < 1 else "1" if k == 1 else "inside")
        top_ps |= set(inputs.top_p.cpu().tolist()) if inputs.top_p is not None else set()
        min_ps |= set(inputs.min_p.cpu().tolist()) if inputs.min_p is not None else set()
    assert zero_drafts and greedy_at_zero
    assert top_ks == {"none", "1", "inside"}
    assert set(torch.tensor(_TOP_PS).tolist()) <= top_ps  # as float32, as given
    assert set(torch.tensor(_MIN_PS).tolist()) <= min_ps
    assert {c.case.dtype for c in V1_CASES} == {_F32, _BF16, _F16}
    assert {c.case.seeded for c in V1_CASES} == {True, False}
    assert {c.case.max_k for c in V1_CASES} >= {1, 3}


@pytest.mark.parametrize("fold", V1_CASES, ids=str)
def test_v1_folded_equals_the_unfolded_chain(fold: V1Fold) -> None:
    inputs = build_v1(fold)
    want = run_v1(unfolded_v1(inputs))
    got = run_v1(inputs)
    assert torch.equal(got, want), (got.tolist(), want.tolist())


def test_v1_unfolded_chain_applies_the_parameters() -> None:
    """What the chain verifies: the processed rows (temperature, min-p, top-k/top-p),
    and no parameters left to fold again."""
    inputs = build_v1(V1Fold(Case(3, 2, 50, mode="random"), seed=3))
    processed = process_v1(inputs)
    unfolded = unfolded_v1(inputs)
    assert torch.equal(unfolded.target_logits, processed)
    assert unfolded.sampling_kwargs() == {}
    assert processed.dtype == torch.float32 and processed.shape == inputs.target_logits.shape
    assert not torch.equal(processed, inputs.target_logits.float())


# --------------------------------------------------------------------------------------
# MRV2: folded == parameters applied first, then the unfolded kernel
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mrv2Fold:
    """An MRV2 batch (:class:`~tests.kernels.mrv2_cases.Mrv2Case`) and what it folds
    (its temperatures, 0 for greedy states, are always folded)."""

    case: Mrv2Case
    params: str = "all"
    logits: str = ""

    def __str__(self) -> str:
        return "-".join([self.case.id, self.params, *[self.logits] * bool(self.logits)])


def build_mrv2_fold(fold: Mrv2Fold) -> Mrv2Inputs:
    """The case's raw inputs with its parameters, per request state."""
    inputs = build_mrv2(fold.case)
    gen = torch.Generator().manual_seed(2000 + fold.case.seed)
    states = inputs.temperature.shape[0]
    target = inputs.target_logits
    shaped = _shape_logits(target.clone(), fold.logits, gen)
    if target.stride(0) != target.shape[1]:  # keep the case's strided rows strided
        target.copy_(shaped)
        shaped = target
    params = _params(fold.params, states, fold.case.vocab, fold.case.seed)
    inputs = replace(inputs, target_logits=shaped, apply_sampling_params=True, **params)
    return _moved(inputs)


def run_mrv2(
    inputs: Mrv2Inputs, config: dict[str, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    sampled, counts = rejection_sample_mrv2(*inputs.args(), **inputs.kwargs(), config=config)
    return sampled.cpu(), counts.cpu()


def raw_mrv2(inputs: Mrv2Inputs) -> Mrv2Inputs:
    """``inputs`` without folding: the raw logits verified as already processed."""
    return replace(inputs, apply_sampling_params=False, min_p=None, top_k=None, top_p=None)


def assert_same_mrv2(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    assert torch.equal(got[1], want[1]), (got[1].tolist(), want[1].tolist())
    assert torch.equal(got[0], want[0]), (got[0].tolist(), want[0].tolist())


MRV2_CASES = [
    Mrv2Fold(Mrv2Case(1, 1, 1, _F32, True, "mixed", seed=1)),
    Mrv2Fold(Mrv2Case(3, 2, 2, _BF16, False, "mixed", seed=2)),
    Mrv2Fold(Mrv2Case(4, 3, 7, _F16, True, "random", use_fp64=True, placeholders=0.2,
                      seed=3)),
    Mrv2Fold(Mrv2Case(5, 3, 517, _F32, True, "mixed", placeholders=0.1, seed=4)),
    Mrv2Fold(Mrv2Case(3, 1, 517, _BF16, False, "greedy", seed=5)),
    Mrv2Fold(Mrv2Case(4, 3, 1000, _F16, False, "random", use_fp64=True, seed=6), "temp"),
    Mrv2Fold(Mrv2Case(4, 2, 1000, _F32, True, "mixed", draft_vocab_extra=3, strided=True,
                      seed=7), "no_min_p"),
    Mrv2Fold(Mrv2Case(4, 3, 300, _BF16, True, "random", seed=8), "top_k"),
    Mrv2Fold(Mrv2Case(3, 2, 1000, _F32, False, "mixed", use_fp64=True, seed=9),
             "top_p_min_p"),
    Mrv2Fold(Mrv2Case(3, 0, 517, _F32, True, "mixed", seed=10)),
    Mrv2Fold(Mrv2Case(3, 2, 4099, _BF16, True, "mixed", seed=11)),
    Mrv2Fold(Mrv2Case(5, 3, 300, _F32, True, "mixed", seed=12), logits="ties"),
    Mrv2Fold(Mrv2Case(4, 2, 1000, _F16, False, "random", seed=13), "no_min_p", "ties"),
    Mrv2Fold(Mrv2Case(5, 3, 517, _F32, True, "mixed", placeholders=0.1, seed=14),
             logits="neginf"),
    Mrv2Fold(Mrv2Case(2, 2, 32000, _F32, True, "mixed", ragged=False, seed=15)),
]


def test_mrv2_cases_cover_the_parameters() -> None:
    """Across the cases: greedy states (temperature 0) and random ones, placeholder
    drafts, requests without drafts, both drafters, float64 Gumbel, every dtype."""
    greedy = random_ = placeholders = zero_drafts = False
    for fold in MRV2_CASES:
        inputs = build_mrv2_fold(fold)
        temps = inputs.temperature[inputs.idx_mapping.long()].cpu()
        greedy |= bool((temps == 0).any())
        random_ |= bool((temps > 0).any())
        placeholders |= bool((inputs.draft_sampled.cpu() == -1).any())
        zero_drafts |= bool((torch.diff(inputs.cu_num_logits.cpu()) == 1).any())
    assert greedy and random_ and placeholders and zero_drafts
    assert {f.case.draft_logits for f in MRV2_CASES} == {True, False}
    assert {f.case.use_fp64 for f in MRV2_CASES} == {True, False}
    assert {f.case.dtype for f in MRV2_CASES} == {_F32, _BF16, _F16}


@pytest.mark.parametrize("fold", MRV2_CASES, ids=str)
def test_mrv2_folded_equals_the_unfolded_chain(fold: Mrv2Fold) -> None:
    inputs = build_mrv2_fold(fold)
    want = run_mrv2(unfolded_mrv2(inputs))
    assert_same_mrv2(run_mrv2(inputs), want)


def test_mrv2_unfolded_chain_applies_the_parameters() -> None:
    inputs = build_mrv2_fold(Mrv2Fold(Mrv2Case(3, 2, 50, _BF16, True, "random", seed=3)))
    processed = process_mrv2(inputs)
    unfolded = unfolded_mrv2(inputs)
    assert torch.equal(unfolded.target_logits, processed)
    assert not unfolded.apply_sampling_params
    assert (unfolded.min_p, unfolded.top_k, unfolded.top_p) == (None, None, None)
    assert processed.dtype == torch.float32
    assert not torch.equal(processed, inputs.target_logits.float())
    # Without the flag, nothing is processed (only the float32 copy).
    assert torch.equal(process_mrv2(raw_mrv2(inputs)), inputs.target_logits.float())


# --------------------------------------------------------------------------------------
# Every config of the folded spaces: the same tokens
# --------------------------------------------------------------------------------------


def _sample_configs(space: SearchSpace, fixed: list[dict[str, int]], count: int,
                    seed: int) -> list[dict[str, int]]:
    """``fixed`` (completed with the space's smallest warps and stages) and random valid
    configs of ``space`` (fixed ``seed``) up to ``count``; no config twice."""
    rng = random.Random(seed)
    chosen = [space.validate({"num_warps": 1, "num_stages": 1, **c}) for c in fixed]
    while len(chosen) < count:
        config = {p.name: rng.choice(p.values) for p in space.params}
        if space.is_valid(config) and config not in chosen:
            chosen.append(space.validate(config))
    return chosen


V1_SPACE = V1_FOLDED.search_space(BACKEND)
MRV2_SPACE = MRV2_FOLDED.search_space(BACKEND)
# Small tiles, many splits, both pivot extremes (PIVOTS * BLOCK_T <= 2**17), big tiles.
V1_CONFIGS = _sample_configs(V1_SPACE, [
    {"BLOCK_V": 256, "SPLITS": 4, "BLOCK_T": 256, "PIVOTS": 4, "num_warps": 4},
    {"BLOCK_V": 256, "SPLITS": 64, "BLOCK_T": 2048, "PIVOTS": 64},
    {"BLOCK_V": 512, "SPLITS": 2, "BLOCK_T": 512, "PIVOTS": 64, "num_warps": 8,
     "num_stages": 3},
    {"BLOCK_V": 16384, "SPLITS": 1, "BLOCK_T": 16384, "PIVOTS": 8, "num_warps": 16,
     "num_stages": 4},
    {"BLOCK_V": 1024, "SPLITS": 8, "BLOCK_T": 256, "PIVOTS": 16, "num_warps": 2},
], count=8, seed=11)
MRV2_CONFIGS = _sample_configs(MRV2_SPACE, [
    {"BLOCK_V": 256, "BLOCK_R": 256, "SPLITS": 4, "BLOCK_T": 256, "PIVOTS": 4,
     "num_warps": 4},
    {"BLOCK_V": 256, "BLOCK_R": 1024, "SPLITS": 64, "BLOCK_T": 2048, "PIVOTS": 64},
    {"BLOCK_V": 512, "BLOCK_R": 512, "SPLITS": 2, "BLOCK_T": 512, "PIVOTS": 64,
     "num_warps": 8, "num_stages": 3},
    {"BLOCK_V": 16384, "BLOCK_R": 16384, "SPLITS": 1, "BLOCK_T": 16384, "PIVOTS": 8,
     "num_warps": 16, "num_stages": 4},
    {"BLOCK_V": 1024, "BLOCK_R": 512, "SPLITS": 8, "BLOCK_T": 256, "PIVOTS": 16,
     "num_warps": 2},
], count=8, seed=12)

V1_CONFIG_CASES = [
    V1Fold(Case(4, 3, 1000), seed=21),
    V1Fold(Case(3, 2, 700, _BF16, draft_probs=False, mode="random", seeded=True),
           logits="ties", seed=22),
]
MRV2_CONFIG_CASES = [
    Mrv2Fold(Mrv2Case(4, 3, 1000, _F32, True, "mixed", placeholders=0.2, seed=21)),
    Mrv2Fold(Mrv2Case(3, 2, 700, _BF16, False, "random", use_fp64=True, seed=22),
             logits="ties"),
]


def _config_id(config: dict[str, int]) -> str:
    return "-".join(f"{k.replace('num_', '')}{v}" for k, v in config.items())


def test_sampled_configs_reach_the_corners() -> None:
    for space, configs in ((V1_SPACE, V1_CONFIGS), (MRV2_SPACE, MRV2_CONFIGS)):
        assert len(configs) == 8
        assert all(space.is_valid(c) for c in configs)
        assert {4, 64} <= {c["PIVOTS"] for c in configs}
        assert max(c["SPLITS"] for c in configs) > 1
        assert min(c["BLOCK_V"] for c in configs) == 256
        assert min(c["BLOCK_T"] for c in configs) == 256
        assert all(c["PIVOTS"] * c["BLOCK_T"] <= 2**17 for c in configs)


_V1_BASELINES: dict[V1Fold, tuple[RejectionInputs, torch.Tensor]] = {}
_MRV2_BASELINES: dict[Mrv2Fold, tuple[Mrv2Inputs, tuple[torch.Tensor, torch.Tensor]]] = {}


def _v1_baseline(fold: V1Fold) -> tuple[RejectionInputs, torch.Tensor]:
    """The case's inputs and the default config's tokens (checked against the chain)."""
    if fold not in _V1_BASELINES:
        inputs = build_v1(fold)
        out = run_v1(inputs)
        assert torch.equal(out, run_v1(unfolded_v1(inputs)))
        _V1_BASELINES[fold] = inputs, out
    return _V1_BASELINES[fold]


def _mrv2_baseline(fold: Mrv2Fold) -> tuple[Mrv2Inputs, tuple[torch.Tensor, torch.Tensor]]:
    if fold not in _MRV2_BASELINES:
        inputs = build_mrv2_fold(fold)
        out = run_mrv2(inputs)
        assert_same_mrv2(out, run_mrv2(unfolded_mrv2(inputs)))
        _MRV2_BASELINES[fold] = inputs, out
    return _MRV2_BASELINES[fold]


@pytest.mark.parametrize("config", V1_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("fold", V1_CONFIG_CASES, ids=str)
def test_v1_every_config_gives_the_same_tokens(fold: V1Fold, config: dict[str, int]) -> None:
    inputs, want = _v1_baseline(fold)
    got = run_v1(inputs, config)
    assert torch.equal(got, want), (got.tolist(), want.tolist())


@pytest.mark.parametrize("config", MRV2_CONFIGS, ids=_config_id)
@pytest.mark.parametrize("fold", MRV2_CONFIG_CASES, ids=str)
def test_mrv2_every_config_gives_the_same_tokens(
    fold: Mrv2Fold, config: dict[str, int]
) -> None:
    inputs, want = _mrv2_baseline(fold)
    assert_same_mrv2(run_mrv2(inputs, config), want)


def test_unfolded_configs_are_refused_when_folding() -> None:
    """Folding takes the folded space's configs: one without the pre-pass's keys is
    refused, and the unfolded launch refuses the pre-pass's keys."""
    inputs = build_v1(V1Fold(Case(2, 2, 300, mode="random"), seed=30))
    folded = V1_CONFIGS[0]
    plain = {k: v for k, v in folded.items() if k not in ("BLOCK_T", "PIVOTS")}
    with pytest.raises(ValueError, match=r"BLOCK_T|PIVOTS"):
        run_v1(inputs, plain)
    with pytest.raises(ValueError, match=r"BLOCK_T|PIVOTS"):
        run_v1(raw_v1(inputs), folded)
    with pytest.raises(ValueError, match="PIVOTS"):
        run_v1(inputs, {**folded, "BLOCK_T": 4096, "PIVOTS": 64})


# --------------------------------------------------------------------------------------
# Folding matters: the comparisons above can fail
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("draft_probs", [True, False], ids=["dp", "nodp"])
def test_v1_top_k_1_emits_each_rows_argmax(draft_probs: bool) -> None:
    """With top-k 1 every random row is one-hot at its argmax: a draft is accepted iff
    it is the argmax, and a rejection recovers the argmax. Verifying the raw logits
    instead gives other tokens."""
    case = Case(8, 3, 517, draft_probs=draft_probs, mode="random", zero_drafts=False)
    inputs = build_v1(V1Fold(case, "temp", seed=40))
    inputs = replace(inputs, top_k=torch.ones(8, dtype=torch.int32, device=DEVICE))
    out = run_v1(inputs)
    assert torch.equal(out, run_v1(unfolded_v1(inputs)))
    argmax = inputs.target_logits.float().argmax(dim=-1).cpu()
    cu = [0, *inputs.cu_num_draft_tokens.cpu().tolist()]
    checked = 0
    for req in range(8):
        for j in range(cu[req + 1] - cu[req]):
            if int(out[req, j]) == -1:
                break
            assert int(out[req, j]) == int(argmax[cu[req] + j]), (req, j)
            checked += 1
    assert checked >= 8
    assert not torch.equal(run_v1(raw_v1(inputs)), out)


@pytest.mark.parametrize("draft_logits", [True, False], ids=["dl", "nodl"])
def test_mrv2_top_k_1_emits_each_rows_argmax(draft_logits: bool) -> None:
    """Top-k 1 in every state: every emitted token (accepted, recovered, bonus) is its
    row's argmax. Verifying the raw logits instead gives other tokens."""
    inputs = build_mrv2_fold(Mrv2Fold(
        Mrv2Case(6, 3, 517, _F32, draft_logits, "mixed", seed=41), "temp"))
    states = inputs.temperature.shape[0]
    inputs = replace(inputs, top_k=torch.ones(states, dtype=torch.int64, device=DEVICE))
    out = run_mrv2(inputs)
    assert_same_mrv2(out, run_mrv2(unfolded_mrv2(inputs)))
    argmax = inputs.target_logits.float().argmax(dim=-1).cpu()
    cu = inputs.cu_num_logits.cpu().tolist()
    for req, tokens in enumerate(output_lists(*out)):
        assert tokens == argmax[cu[req] : cu[req] + len(tokens)].tolist(), req
    raw = run_mrv2(raw_mrv2(inputs))
    assert not (torch.equal(raw[0], out[0]) and torch.equal(raw[1], out[1]))


def test_folding_changes_tokens_across_a_batch_of_cases() -> None:
    """Realistic parameters on several batches: the folded tokens are the chain's, and
    for some batches not those of verifying the raw logits."""
    differ = 0
    for seed in range(3):
        v1 = build_v1(V1Fold(Case(4, 3, 300, mode="mixed", draft_probs=seed != 1),
                             "no_min_p", seed=50 + seed))
        out = run_v1(v1)
        assert torch.equal(out, run_v1(unfolded_v1(v1)))
        differ += not torch.equal(out, run_v1(raw_v1(v1)))
        mrv2 = build_mrv2_fold(Mrv2Fold(
            Mrv2Case(4, 3, 300, _F32, seed != 1, "mixed", seed=50 + seed), "no_min_p"))
        got = run_mrv2(mrv2)
        assert_same_mrv2(got, run_mrv2(unfolded_mrv2(mrv2)))
        raw = run_mrv2(raw_mrv2(mrv2))
        differ += not (torch.equal(raw[0], got[0]) and torch.equal(raw[1], got[1]))
    assert differ >= 1


# --------------------------------------------------------------------------------------
# The folded families the tuner sees
# --------------------------------------------------------------------------------------

FAMILY_CASES = [
    (V1_FOLDED, Problem(spec_len=3, batch=4, vocab=1000, dtype="bfloat16", draft_probs=True)),
    (V1_FOLDED, Problem(spec_len=2, batch=3, vocab=97, dtype="float32", draft_probs=False)),
    (MRV2_FOLDED, Problem(spec_len=3, batch=2, vocab=600, dtype="float16",
                          draft_probs=True)),
    (MRV2_FOLDED, Problem(spec_len=1, batch=2, vocab=257, dtype="float32",
                          draft_probs=False)),
]


def _family_id(case: tuple[Any, Problem]) -> str:
    family, p = case
    return f"{family.name}-k{p.spec_len}-B{p.batch}-V{p.vocab}-{p.dtype}-{p.draft_probs}"


def test_families_are_registered() -> None:
    assert FAMILIES["rejection_sample_folded"] is V1_FOLDED
    assert FAMILIES["rejection_sample_mrv2_folded"] is MRV2_FOLDED
    assert V1_FOLDED.name == "rejection_sample_folded"
    assert MRV2_FOLDED.name == "rejection_sample_mrv2_folded"
    for folded, plain in ((V1_FOLDED, "rejection_sample"),
                          (MRV2_FOLDED, "rejection_sample_mrv2")):
        # The space the launcher validates a folded launch against (its space module's
        # FOLDED): the unfolded family's parameters and the pre-pass's tile and pivots.
        assert folded.space is FAMILIES[plain].space.FOLDED  # type: ignore[attr-defined]
        assert (set(folded.search_space(BACKEND).names)
                == set(FAMILIES[plain].search_space(BACKEND).names) | {"BLOCK_T", "PIVOTS"})
        # The same kernels, so the same code hash; rows are told apart by family name.
        assert folded.source_modules == FAMILIES[plain].source_modules
        assert folded.source_hash == FAMILIES[plain].source_hash


@pytest.mark.parametrize("case", FAMILY_CASES, ids=_family_id)
def test_family_round_trip(case: tuple[Any, Problem]) -> None:
    """make_inputs gives raw logits and parameters, problem_of round-trips, the default
    config's launch is the reference's tokens and the unfolded chain's."""
    family, problem = case
    inputs = family.make_inputs(problem, seed=7, device=DEVICE)
    assert family.problem_of(inputs) == problem
    is_v1 = family is V1_FOLDED
    count = problem.batch if is_v1 else inputs.temperature.shape[0]
    assert inputs.temperature is not None and inputs.temperature.shape == (count,)
    assert bool((inputs.temperature > 0).all())
    assert inputs.top_k is not None and inputs.top_k.shape == (count,)
    assert bool((inputs.top_k >= 1).all()) and bool((inputs.top_k <= problem.vocab).all())
    assert inputs.top_p is not None and inputs.top_p.shape == (count,)
    assert bool((inputs.top_p > 0).all()) and bool((inputs.top_p <= 1).all())
    if is_v1:
        assert inputs.sampling_kwargs().keys() == {"temperature", "top_k", "top_p"}
    else:
        assert inputs.apply_sampling_params
    again = family.make_inputs(problem, seed=7, device=DEVICE)
    assert torch.equal(again.top_k, inputs.top_k) and torch.equal(again.top_p, inputs.top_p)

    plain = FAMILIES["rejection_sample" if is_v1 else "rejection_sample_mrv2"]
    config = family.default_config(problem, BACKEND)
    unfolded = plain.default_config(problem, BACKEND)
    assert {name: config[name] for name in unfolded} == unfolded
    assert family.search_space(BACKEND).is_valid(config)
    out = family.launch(inputs, config)
    assert family.same(family.reference(inputs), out)
    chain = unfolded_v1(inputs) if is_v1 else unfolded_mrv2(inputs)
    plain_config = plain.default_config(plain.problem_of(chain), BACKEND)
    assert family.same(out, plain.launch(chain, plain_config))
    # The launcher's own default (config=None) is the family's default.
    if is_v1:
        assert family.same(out, run_v1(inputs))
        wrong = out.clone()
        wrong[0, 0] = (wrong[0, 0] + 1) % problem.vocab
    else:
        assert family.same(out, run_mrv2(inputs))
        wrong = (out[0], out[1].clone())
        wrong[1][0] += 1
    assert not family.same(out, wrong)


def test_draw_sampling_params() -> None:
    gen = torch.Generator().manual_seed(0)
    temperature, top_k, top_p = draw_sampling_params(400, 30, generator=gen)
    assert temperature.dtype == torch.float32 and top_p.dtype == torch.float32
    assert top_k.dtype == torch.int32
    assert bool((temperature >= 0.5).all()) and bool((temperature < 1.5).all())
    assert bool((top_k >= 1).all()) and bool((top_k <= 30).all())
    assert bool((top_k == 30).any()) and bool((top_k == 1).any())
    assert bool((top_p >= 0.5).all()) and bool((top_p <= 1).all())
    assert bool((top_p == 1).any()) and bool((top_p < 1).any())


# --------------------------------------------------------------------------------------
# Validation: bad parameters refused by name
# --------------------------------------------------------------------------------------


def _v1_valid() -> RejectionInputs:
    """3 requests (the middle one greedy), every parameter given."""
    inputs = build_v1(V1Fold(Case(3, 2, 11, mode="random", zero_drafts=False), seed=60))
    greedy = torch.tensor([False, True, False], device=DEVICE)
    return replace(inputs, is_greedy=greedy,
                   min_p=torch.full((3,), 0.1, device=DEVICE))


def _set(t: torch.Tensor, index: int, value: float) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


V1_BAD: list[tuple[str, str, Any]] = [
    ("temperature-float64", "temperature", lambda i: {"temperature": i.temperature.double()}),
    ("temperature-short", "temperature", lambda i: {"temperature": i.temperature[:2]}),
    ("temperature-2d", "temperature", lambda i: {"temperature": i.temperature[None]}),
    ("temperature-0-random", "temperature",
     lambda i: {"temperature": _set(i.temperature, 0, 0.0)}),
    ("temperature-negative-random", "temperature",
     lambda i: {"temperature": _set(i.temperature, 2, -1.0)}),
    ("temperature-nan-random", "temperature",
     lambda i: {"temperature": _set(i.temperature, 0, float("nan"))}),
    ("temperature-inf-random", "temperature",
     lambda i: {"temperature": _set(i.temperature, 0, float("inf"))}),
    ("top_k-float", "top_k", lambda i: {"top_k": i.top_k.float()}),
    ("top_k-int16", "top_k", lambda i: {"top_k": i.top_k.short()}),
    ("top_k-long", "top_k", lambda i: {"top_k": torch.cat([i.top_k, i.top_k])}),
    ("top_p-float64", "top_p", lambda i: {"top_p": i.top_p.double()}),
    ("top_p-short", "top_p", lambda i: {"top_p": i.top_p[:1]}),
    ("top_p-0", "top_p", lambda i: {"top_p": _set(i.top_p, 0, 0.0)}),
    ("top_p-above-1", "top_p", lambda i: {"top_p": _set(i.top_p, 1, 1.5)}),
    ("top_p-nan", "top_p", lambda i: {"top_p": _set(i.top_p, 2, float("nan"))}),
    ("min_p-float16", "min_p", lambda i: {"min_p": i.min_p.half()}),
    ("min_p-2d", "min_p", lambda i: {"min_p": i.min_p[:, None]}),
    ("min_p-negative", "min_p", lambda i: {"min_p": _set(i.min_p, 0, -0.1)}),
    ("min_p-above-1", "min_p", lambda i: {"min_p": _set(i.min_p, 2, 1.01)}),
    ("min_p-nan", "min_p", lambda i: {"min_p": _set(i.min_p, 1, float("nan"))}),
]


def test_v1_valid_parameters_are_accepted() -> None:
    """The base of the mutations runs, and a greedy request's temperature is ignored
    (0, negative or NaN alike)."""
    inputs = _v1_valid()
    out = run_v1(inputs)
    assert torch.equal(out, run_v1(unfolded_v1(inputs)))
    for value in (0.0, -1.0, float("nan")):
        ignored = replace(inputs, temperature=_set(inputs.temperature, 1, value))
        assert torch.equal(run_v1(ignored), out), value


@pytest.mark.parametrize(("name", "mutate"), [(n, m) for _, n, m in V1_BAD],
                         ids=[i for i, _, _ in V1_BAD])
def test_v1_bad_parameter_is_refused_by_name(name: str, mutate: Any) -> None:
    bad = replace(_v1_valid(), **mutate(_v1_valid()))
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        rejection_sample(*bad.args(), **bad.kwargs())


def test_v1_validate_false_still_checks_shapes_and_dtypes() -> None:
    inputs = _v1_valid()
    for change in ({"top_k": inputs.top_k.float()}, {"min_p": inputs.min_p[:2]}):
        bad = replace(inputs, **change)
        with pytest.raises(ValueError, match=next(iter(change))):
            rejection_sample(*bad.args(), **bad.kwargs(), validate=False)


_MRV2_VALID = Mrv2Case(3, 2, 7, _F32, True, "mixed", spare_states=2, seed=71)


def _mrv2_valid() -> Mrv2Inputs:
    return build_mrv2_fold(Mrv2Fold(_MRV2_VALID))


MRV2_BAD: list[tuple[str, str, Any]] = [
    ("min_p-without-flag", "min_p",
     lambda i: {"apply_sampling_params": False, "top_k": None, "top_p": None}),
    ("top_k-without-flag", "top_k",
     lambda i: {"apply_sampling_params": False, "min_p": None, "top_p": None}),
    ("top_p-without-flag", "top_p",
     lambda i: {"apply_sampling_params": False, "min_p": None, "top_k": None}),
    ("flag-int", "apply_sampling_params", lambda i: {"apply_sampling_params": 1}),
    ("min_p-short", "min_p", lambda i: {"min_p": i.min_p[:-1]}),
    ("min_p-per-request", "min_p", lambda i: {"min_p": i.min_p[i.idx_mapping.long()]}),
    ("min_p-float64", "min_p", lambda i: {"min_p": i.min_p.double()}),
    ("top_k-float", "top_k", lambda i: {"top_k": i.top_k.float()}),
    ("top_k-2d", "top_k", lambda i: {"top_k": i.top_k[None]}),
    ("top_p-bfloat16", "top_p", lambda i: {"top_p": i.top_p.bfloat16()}),
    ("top_p-long", "top_p", lambda i: {"top_p": torch.cat([i.top_p, i.top_p[:1]])}),
    ("top_p-0", "top_p", lambda i: {"top_p": _set(i.top_p, 0, 0.0)}),
    ("top_p-above-1", "top_p", lambda i: {"top_p": _set(i.top_p, 1, 1.5)}),
    ("min_p-negative", "min_p", lambda i: {"min_p": _set(i.min_p, 0, -0.5)}),
    ("min_p-above-1", "min_p", lambda i: {"min_p": _set(i.min_p, 1, 2.0)}),
    ("temperature-negative", "temperature",
     lambda i: {"temperature": _set(i.temperature, int(i.idx_mapping[0]), -0.5)}),
]


def test_mrv2_valid_parameters_are_accepted() -> None:
    inputs = _mrv2_valid()
    assert_same_mrv2(run_mrv2(inputs), run_mrv2(unfolded_mrv2(inputs)))


@pytest.mark.parametrize(("name", "mutate"), [(n, m) for _, n, m in MRV2_BAD],
                         ids=[i for i, _, _ in MRV2_BAD])
def test_mrv2_bad_parameter_is_refused_by_name(name: str, mutate: Any) -> None:
    inputs = _mrv2_valid()
    bad = replace(inputs, **mutate(inputs))
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        rejection_sample_mrv2(*bad.args(), **bad.kwargs())


def test_mrv2_validate_false_still_checks_shapes_and_dtypes() -> None:
    inputs = _mrv2_valid()
    bad = replace(inputs, top_k=inputs.top_k.float())
    with pytest.raises(ValueError, match="top_k"):
        rejection_sample_mrv2(*bad.args(), **bad.kwargs(), validate=False)
    bad = replace(inputs, apply_sampling_params=False)
    with pytest.raises(ValueError, match="apply_sampling_params"):
        rejection_sample_mrv2(*bad.args(), **bad.kwargs(), validate=False)
