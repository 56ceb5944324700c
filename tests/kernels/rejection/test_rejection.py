"""``spectune.kernels.rejection_sample``: the fused kernels against the PyTorch reference."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
import torch

from spectune.identity import backend_of
from spectune.kernels import FAMILIES, LOGITS_DTYPES, MAX_VOCAB, rejection_sample
from spectune.kernels.rejection import (
    RejectionInputs,
    decision_margins_agree,
    draw_random_inputs,
    rejection_sample_reference,
)

# White-box: the fixed-point width the vocabulary bound is derived from.
from spectune.kernels.rejection.rejection_sample_constants import FIXED_POINT_BITS
from spectune.space import DTYPES, Problem
from tests.kernels.conftest import DEVICE, Case, build, on_device

FAMILY = FAMILIES["rejection_sample"]
SMALL_TILE = {"BLOCK_V": 256, "SPLITS": 1, "num_warps": 1, "num_stages": 1}
SPLIT_TILE = {"BLOCK_V": 256, "SPLITS": 4, "num_warps": 4, "num_stages": 2}


def run(inputs: RejectionInputs, config: dict[str, int] | None = None) -> torch.Tensor:
    return rejection_sample(*inputs.args(), **inputs.kwargs(), config=config)


def assert_matches_reference(inputs: RejectionInputs, out: torch.Tensor) -> None:
    ref = rejection_sample_reference(*inputs.args(), **inputs.kwargs())
    ok, why = decision_margins_agree(ref, out)
    assert ok, why


# Odd shapes around the default tile (8192) and the small test tile (256).
CASES = [
    Case(1, 1, 1),
    Case(1, 1, 7, mode="random"),
    Case(3, 2, 7, mode="greedy"),
    Case(16, 8, 7, dtype=torch.bfloat16),
    Case(5, 3, 255, dtype=torch.float16, draft_probs=False),
    Case(2, 8, 256, mode="random", draft_probs=False),
    Case(7, 4, 257, mode="random"),
    Case(4, 5, 1000, dtype=torch.bfloat16, mode="random"),
    Case(9, 6, 511, draft_probs=False, mode="greedy", zero_drafts=False),
    Case(2, 3, 8191, mode="random"),
    Case(2, 2, 8192, dtype=torch.float16),
    Case(3, 2, 8193, draft_probs=False, mode="random"),
    Case(11, 7, 129, seeded=True, mode="random"),
    Case(6, 4, 300, seeded=True, draft_probs=False),
]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize(
    "config", [None, SMALL_TILE, SPLIT_TILE], ids=["default", "tile256", "split4"]
)
def test_matches_reference(case: Case, config: dict[str, int] | None) -> None:
    inputs = build(case, seed=hash(str(case)) % 1000)
    assert_matches_reference(inputs, run(inputs, config))


@pytest.mark.parametrize(
    "case",
    [
        Case(2, 4, 32000, mode="mixed"),
        Case(1, 3, 128256, dtype=torch.bfloat16, mode="random"),
        Case(2, 2, 151936, draft_probs=False, mode="random"),
    ],
    ids=str,
)
def test_real_vocabularies(case: Case) -> None:
    inputs = build(case, seed=7)
    out = run(inputs)
    assert_matches_reference(inputs, out)
    # A second config splits the row differently: the tokens stay bit-identical.
    assert torch.equal(run(inputs, {**SPLIT_TILE, "BLOCK_V": 4096, "SPLITS": 16}), out)


def test_output_layout_and_dtype() -> None:
    inputs = build(Case(4, 3, 50, mode="greedy"), seed=1)
    out = run(inputs)
    assert out.dtype == torch.int32
    assert out.shape == (4, 4)


# --------------------------------------------------------------------------------------
# Hand-made cases with known answers
# --------------------------------------------------------------------------------------


def _inputs(
    logits: list[list[float]],
    drafts: list[int],
    counts: list[int],
    bonus: list[int],
    *,
    max_spec_len: int,
    greedy: list[bool] | None = None,
    draft_probs: list[list[float]] | None = None,
    uniform: list[float] | None = None,
    inv_q: list[list[float]] | None = None,
) -> RejectionInputs:
    cu = torch.cumsum(torch.tensor(counts), 0).to(torch.int64)
    return on_device(RejectionInputs(
        draft_token_ids=torch.tensor(drafts, dtype=torch.int64).reshape(-1),
        cu_num_draft_tokens=cu,
        target_logits=torch.tensor(logits, dtype=torch.float32).reshape(len(drafts), -1),
        bonus_token_ids=torch.tensor(bonus, dtype=torch.int64),
        max_spec_len=max_spec_len,
        draft_probs=None if draft_probs is None else torch.tensor(draft_probs),
        is_greedy=None if greedy is None else torch.tensor(greedy),
        uniform_probs=None if uniform is None else torch.tensor(uniform, dtype=torch.float64),
        inv_q=None if inv_q is None else torch.tensor(inv_q, dtype=torch.float32),
    ))


@pytest.mark.parametrize("config", [SMALL_TILE, {**SPLIT_TILE, "SPLITS": 2}])
def test_greedy_chain_stops_at_first_mismatch_and_ties_take_first_index(config) -> None:
    vocab = 600  # three 256-tiles: ties across tiles and splits
    row0 = [0.0] * vocab
    row0[5] = row0[300] = row0[599] = 9.0  # tie: the first index (5) wins
    row1 = [0.0] * vocab
    row1[512] = 3.0
    row2 = [0.0] * vocab
    row2[1] = 4.0
    inputs = _inputs(
        [row0, row1, row2, row2], drafts=[5, 512, 2, 1], counts=[3, 0, 1], bonus=[11, 22, 33],
        max_spec_len=3,
    )
    out = run(inputs, config)
    assert out.tolist() == [
        [5, 512, 1, -1],  # third draft (2) != argmax (1): emit 1 and stop
        [22, -1, -1, -1],  # no drafts: only the bonus, at position 0
        [1, 33, -1, -1],  # accepted: bonus at position n = 1
    ]


def test_all_negative_infinity_except_one() -> None:
    vocab = 300
    row = [float("-inf")] * vocab
    row[299] = -1e30
    inputs = _inputs([row], drafts=[299], counts=[1], bonus=[3], max_spec_len=1)
    assert run(inputs, SMALL_TILE).tolist() == [[299, 3]]


@pytest.mark.parametrize("config", [SMALL_TILE, {**SPLIT_TILE, "SPLITS": 2}])
def test_random_padded_draft_is_rejected_and_zero_draft_prob_rejects(config) -> None:
    vocab = 400
    logits = [[0.0] * vocab for _ in range(3)]
    dp = [[1.0 / vocab] * vocab for _ in range(3)]
    dp[1][7] = 0.0  # draft prob 0 for the second row's draft: always rejected
    inputs = _inputs(
        logits, drafts=[-1, 7, 9], counts=[1, 2], bonus=[1, 2], max_spec_len=2,
        greedy=[False, False], draft_probs=dp, uniform=[0.0, 0.0, 0.0],
        inv_q=[[1.0] * vocab, [1.0] * vocab],
    )
    out = run(inputs, config)
    # Request 0: uniform target == uniform draft, so the residual is zero everywhere
    # and the recovered token is the lowest index (0) of this all-zero tie.
    # Request 1: the draft's own prob is 0, so the residual is positive only there.
    assert out[:, 0].tolist() == [0, 7]
    assert out[:, 1:].tolist() == [[-1, -1], [-1, -1]]


def test_recovered_ties_take_lowest_index_across_splits() -> None:
    vocab = 1024
    logits = [[0.0] * vocab]
    inv = [1.0] * vocab
    inv[700] = inv[900] = 5.0  # equal best scores in different splits
    inputs = _inputs(
        logits, drafts=[3], counts=[1], bonus=[0], max_spec_len=1, greedy=[False],
        uniform=[1.0], inv_q=[inv],  # u = 1 > p(d): rejected
    )
    for splits in (1, 2, 4):
        assert run(inputs, {**SMALL_TILE, "SPLITS": splits}).tolist() == [[700, -1]]


def test_without_draft_probs_recovered_excludes_the_draft() -> None:
    vocab = 10
    logits = [[0.0] * vocab]
    logits[0][4] = 10.0  # the draft holds nearly all the mass
    inv = [1.0] * vocab
    inv[4] = 1e6
    inputs = _inputs(
        logits, drafts=[4], counts=[1], bonus=[0], max_spec_len=1, greedy=[False],
        uniform=[1.0], inv_q=[inv],
    )
    token = run(inputs, SMALL_TILE)[0, 0].item()
    assert token != 4
    assert token == 0  # the rest is a tie: lowest index


def test_acceptance_is_ratio_at_least_u() -> None:
    logits = [[0.0, 0.0, 0.0, 0.0]] * 2  # p = 0.25 everywhere
    dp = [[0.5, 0.5, 0.0, 0.0]] * 2  # ratio p/dp = 0.5 for token 0
    for u, accepted in ((0.5, True), (0.5000001, False), (0.25, True)):
        inputs = _inputs(
            logits, drafts=[0, 0], counts=[2], bonus=[3], max_spec_len=2, greedy=[False],
            draft_probs=dp, uniform=[u, u], inv_q=[[1.0, 1.0, 1.0, 1.0]],
        )
        out = run(inputs, SMALL_TILE).tolist()[0]
        assert (out == [0, 0, 3]) is accepted
        if not accepted:
            assert out[0] == 2  # residual max(p - dp, 0): tokens 2 and 3 tie, lowest wins


# --------------------------------------------------------------------------------------
# Every configuration of the declared space gives bit-identical tokens
# --------------------------------------------------------------------------------------


def _space_sample(backend: str, count: int, seed: int) -> list[dict[str, int]]:
    configs = list(FAMILY.search_space(backend))
    by_value: dict[tuple[int, int], dict[str, int]] = {}
    # Always the extremes: smallest and largest tile with fewest and most splits.
    for c in configs:
        by_value.setdefault((c["BLOCK_V"], c["SPLITS"]), c)
    tiles = sorted({c["BLOCK_V"] for c in configs})
    splits = sorted({c["SPLITS"] for c in configs})
    extremes = [by_value[(t, s)] for t, s in itertools.product(
        (tiles[0], tiles[-1]), (splits[0], splits[-1]))]
    rng = random.Random(seed)
    return extremes + rng.sample(configs, count)


@pytest.mark.parametrize(
    "case",
    [
        Case(3, 4, 1500, mode="mixed"),
        Case(2, 3, 2049, draft_probs=False, mode="random", dtype=torch.bfloat16),
        Case(4, 2, 700, seeded=True, mode="random"),
    ],
    ids=str,
)
def test_every_configuration_gives_identical_tokens(case: Case) -> None:
    inputs = build(case, seed=3)
    baseline = run(inputs, SMALL_TILE)
    assert_matches_reference(inputs, baseline)
    for config in _space_sample("cpu-interpreter", 12, seed=len(str(case))):
        assert torch.equal(run(inputs, config), baseline), config


def test_hip_configs_accept_waves_per_eu_and_cuda_rejects_it() -> None:
    hip = FAMILY.search_space("hip")
    cuda = FAMILY.search_space("cuda")
    assert "waves_per_eu" in hip.names
    assert "waves_per_eu" not in cuda.names
    assert hip.size() > cuda.size()


@pytest.mark.parametrize("backend", ["hip", "cuda", "cpu-interpreter"])
@pytest.mark.parametrize("batch,k,vocab", [(1, 1, 1), (1, 8, 151936), (64, 4, 32000), (256, 8, 7)])
def test_default_config_is_valid_and_deterministic(backend, batch, k, vocab) -> None:
    problem = Problem(spec_len=k, batch=batch, vocab=vocab)
    config = FAMILY.default_config(problem, backend)
    FAMILY.search_space(backend).validate(config)
    assert FAMILY.default_config(problem, backend) == config


# --------------------------------------------------------------------------------------
# In-kernel random numbers (seeds)
# --------------------------------------------------------------------------------------


def test_seeded_draws_equal_host_draws() -> None:
    """With seeds, the kernel draws exactly what draw_random_inputs computes on the host."""
    inputs = build(Case(6, 5, 333, seeded=True, mode="random"), seed=11)
    seeded = run(inputs, SPLIT_TILE)
    uniform, inv_q = draw_random_inputs(
        inputs.seeds, inputs.cu_num_draft_tokens, vocab=inputs.target_logits.shape[1]
    )
    explicit = replace(inputs, seeds=None, uniform_probs=uniform, inv_q=inv_q)
    assert torch.equal(run(explicit, SMALL_TILE), seeded)


def test_seeded_tokens_depend_on_the_seed_only() -> None:
    inputs = build(Case(8, 3, 97, seeded=True, mode="random", draft_probs=False), seed=5)
    out = run(inputs)
    # Same seed, same tokens; and a request's tokens don't depend on its neighbours.
    assert torch.equal(run(inputs), out)
    other = inputs.seeds.clone()
    other[1:] += 1
    moved = run(replace(inputs, seeds=other))
    assert torch.equal(moved[0], out[0])
    assert not torch.equal(moved[1:], out[1:])


def test_draws_are_in_range() -> None:
    seeds = torch.tensor([0, -1, 2**62], dtype=torch.int64)
    cu = torch.tensor([1000, 1000, 3000])
    uniform, inv_q = draw_random_inputs(seeds, cu, vocab=5000)
    assert bool((uniform > 0).all()) and bool((uniform < 1).all())
    assert bool(torch.isfinite(inv_q).all()) and bool((inv_q > 0).all())
    # Uniform's mean and Exp(1)'s mean, loosely (50k draws).
    assert abs(float(uniform.mean()) - 0.5) < 0.02
    assert abs(float((1 / inv_q).mean()) - 1.0) < 0.03


# --------------------------------------------------------------------------------------
# Input validation: ValueError naming the argument, before any launch
# --------------------------------------------------------------------------------------


def _good() -> RejectionInputs:
    return build(Case(3, 2, 11, mode="random", zero_drafts=False), seed=2)


def _call(inputs: RejectionInputs, **overrides):
    kwargs = {**inputs.kwargs(), **overrides}
    args = dict(zip(
        ("draft_token_ids", "cu_num_draft_tokens", "target_logits", "bonus_token_ids"),
        inputs.args(), strict=True,
    ))
    for name in list(args):
        if name in kwargs:
            args[name] = kwargs.pop(name)
    return rejection_sample(*args.values(), **kwargs)


BAD = {
    "target_logits 1-D": ({"target_logits": torch.zeros(5)}, "target_logits"),
    "target_logits int": ({"target_logits": torch.zeros(5, 11, dtype=torch.int32)},
                          "target_logits"),
    "draft_token_ids float": ({"draft_token_ids": torch.zeros(5)}, "draft_token_ids"),
    "draft_token_ids length": ({"draft_token_ids": torch.zeros(4, dtype=torch.int32)},
                               "draft_token_ids"),
    "cu not monotonic": ({"cu_num_draft_tokens": torch.tensor([2, 1, 5])},
                         "cu_num_draft_tokens"),
    "cu total": ({"cu_num_draft_tokens": torch.tensor([2, 3, 4])}, "cu_num_draft_tokens"),
    "too many drafts": ({"cu_num_draft_tokens": torch.tensor([0, 0, 5])},
                        "cu_num_draft_tokens"),
    "bonus shape": ({"bonus_token_ids": torch.zeros(3, 2, dtype=torch.int64)},
                    "bonus_token_ids"),
    "draft_probs vocab": ({"draft_probs": torch.zeros(5, 12)}, "draft_probs"),
    "draft_probs dtype": ({"draft_probs": torch.zeros(5, 11, dtype=torch.float16)},
                          "draft_probs"),
    "inv_q vocab": ({"inv_q": torch.ones(3, 10)}, "inv_q"),
    "uniform length": ({"uniform_probs": torch.ones(4, dtype=torch.float64)},
                       "uniform_probs"),
    "missing inv_q": ({"inv_q": None}, "inv_q"),
    "missing random inputs": ({"inv_q": None, "uniform_probs": None}, "uniform_probs"),
    "is_greedy dtype": ({"is_greedy": torch.zeros(3, dtype=torch.int32)}, "is_greedy"),
    "seeds with coins": ({"seeds": torch.zeros(3, dtype=torch.int64)}, "seeds"),
    "max_spec_len negative": ({"max_spec_len": -1}, "max_spec_len"),
    "draft id >= vocab": ({"draft_token_ids": torch.full((5,), 11, dtype=torch.int32)},
                          "draft_token_ids"),
    "not contiguous": ({"target_logits": torch.zeros(11, 5).t()}, "target_logits"),
    "vocab above MAX_VOCAB": ({"target_logits": torch.empty(5, MAX_VOCAB + 1,
                                                            dtype=torch.float16)},
                              "target_logits"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_raises_value_error_naming_the_argument(name: str) -> None:
    overrides, argument = BAD[name]
    with pytest.raises(ValueError, match=argument):
        _call(_good(), **overrides)


def test_device_mismatch_is_named() -> None:
    inputs = _good()
    with pytest.raises(ValueError, match="draft_token_ids"):
        _call(inputs, draft_token_ids=inputs.draft_token_ids.to("meta"))


@pytest.mark.parametrize(
    "config,fragment",
    [
        ({**SMALL_TILE, "BLOCK_V": 300}, "power of two"),
        ({**SMALL_TILE, "SPLITS": -2}, "negative"),
        ({**SMALL_TILE, "tile": 4}, "unknown"),
        ({**SMALL_TILE, "num_warps": 16}, "BLOCK_V >= 64"),
        ({**SMALL_TILE, "waves_per_eu": 1}, "unknown"),  # HIP-only knob on the CPU
    ],
)
def test_invalid_config_is_rejected(config, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        run(_good(), config)


def test_greedy_mask_without_random_inputs_is_fine_when_all_greedy() -> None:
    inputs = replace(
        _good(), is_greedy=torch.ones(3, dtype=torch.bool), uniform_probs=None, inv_q=None
    )
    expected = run(replace(inputs, is_greedy=None))
    assert expected.shape == (3, 3)
    assert torch.equal(run(inputs), expected)


# --------------------------------------------------------------------------------------
# The family interface the tuner sees
# --------------------------------------------------------------------------------------


def test_family_interface_round_trip() -> None:
    problem = Problem(spec_len=3, batch=2, vocab=777, dtype="bfloat16", draft_probs=False)
    inputs = FAMILY.make_inputs(problem, seed=0, device=DEVICE)
    assert inputs.target_logits.dtype == torch.bfloat16
    assert inputs.draft_probs is None
    assert FAMILY.problem_of(inputs) == problem
    config = FAMILY.default_config(problem, "cpu-interpreter")
    out = FAMILY.launch(inputs, config)
    assert FAMILY.same(FAMILY.reference(inputs), out)
    assert FAMILY.same(out, FAMILY.launch(inputs, {**SMALL_TILE, "SPLITS": 2}))
    wrong = out.clone()
    wrong[0, 0] = (wrong[0, 0] + 1) % 777
    assert not FAMILY.same(FAMILY.reference(inputs), wrong)
    assert not FAMILY.same(out, wrong)
    assert len(FAMILY.source_hash) == 16


def test_family_inputs_exercise_accept_and_reject() -> None:
    problem = Problem(spec_len=4, batch=16, vocab=64)
    out = FAMILY.launch(FAMILY.make_inputs(problem, seed=1, device=DEVICE), SMALL_TILE)
    emitted = (out >= 0).sum(dim=1)
    # Realistic acceptance: some chains end early, some run to the bonus.
    assert int(emitted.min()) < 5 and int(emitted.max()) == 5


# --------------------------------------------------------------------------------------
# A seeded sweep over the contract's ranges: B in 1..16, k in 1..8, odd vocabularies
# --------------------------------------------------------------------------------------

_SWEEP_VOCABS = (1, 2, 7, 31, 255, 256, 257, 1023, 4097, 8191, 8193)
_SWEEP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MAX_TILES = 1024


def _sweep_case(seed: int) -> tuple[Case, dict[str, int]]:
    rng = random.Random(seed)
    case = Case(
        batch=rng.randint(1, 16),
        max_k=rng.randint(1, 8),
        vocab=rng.choice(_SWEEP_VOCABS),
        dtype=rng.choice(_SWEEP_DTYPES),
        draft_probs=rng.random() < 0.5,
        mode=rng.choice(("greedy", "random", "mixed")),
        zero_drafts=rng.random() < 0.7,
        seeded=rng.random() < 0.25,
    )
    configs = list(FAMILY.search_space("cpu-interpreter"))
    config = rng.choice(configs)
    # The interpreter's time goes with the vocabulary tiles each request and draft
    # visits: past 1024 of them (seed 5: 54 drafts x 33 tiles, over a minute) a draw
    # takes a config with larger tiles instead; the others test the same paths.
    rows = case.batch * case.max_k

    def tiles(c: dict[str, int]) -> int:
        return rows * -(-case.vocab // c["BLOCK_V"])

    if tiles(config) > _MAX_TILES:
        config = rng.choice([c for c in configs if tiles(c) <= _MAX_TILES])
    return case, config


@pytest.mark.parametrize("seed", range(60))
def test_seeded_sweep_matches_reference(seed: int) -> None:
    case, config = _sweep_case(seed)
    inputs = build(case, seed=seed)
    out = run(inputs, config)
    assert_matches_reference(inputs, out)
    assert torch.equal(out, run(inputs, SMALL_TILE)), (case, config)


@pytest.mark.parametrize("draft_probs", [True, False])
@pytest.mark.parametrize("vocab", [50, 3000])
def test_acceptance_boundary_is_sharp(draft_probs: bool, vocab: int) -> None:
    """Coins 3e-5 (relative) either side of each ratio p(d)/dp(d): every decision exact.

    One draft per request, so each request is one acceptance decision; the margin is
    3x the documented near-tie tolerance, so nothing may differ from the reference.
    """
    batch = 64
    inputs = build(Case(batch, 1, vocab, draft_probs=draft_probs, mode="random",
                        zero_drafts=False), seed=vocab)
    probs = torch.softmax(inputs.target_logits.cpu().float(), dim=-1)
    rows = torch.arange(batch)
    drafts = inputs.draft_token_ids.cpu().long()
    ratio = probs[rows, drafts].double()
    if draft_probs:
        ratio = ratio / inputs.draft_probs.cpu()[rows, drafts].double()
    side = torch.where(rows % 2 == 0, 1.0 - 3e-5, 1.0 + 3e-5).double()
    coins = (ratio * side).clamp(max=1.0).to(inputs.target_logits.device)
    out = run(replace(inputs, uniform_probs=coins), SPLIT_TILE)
    ref = rejection_sample_reference(*inputs.args(), **{**inputs.kwargs(), "uniform_probs": coins})
    assert not bool(ref.near_tie.any())
    accepted = out.cpu()[:, 0] == inputs.draft_token_ids.cpu()
    # Below the ratio: accepted; above it: rejected (a ratio >= 1 always accepts).
    expected = (rows % 2 == 0) | (ratio >= 1.0)
    assert accepted.tolist() == expected.tolist()
    assert int((~expected).sum()) >= 5  # enough sharp rejections to mean something
    assert torch.equal(out.cpu(), ref.tokens)


# --------------------------------------------------------------------------------------
# One problem per launch shape; the supported vocabularies and dtypes
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        Case(3, 4, 300, dtype=torch.bfloat16, mode="random"),
        Case(2, 2, 9000, draft_probs=False, mode="mixed"),
        Case(1, 0, 50, dtype=torch.float16, mode="greedy"),
    ],
    ids=str,
)
def test_default_config_is_that_of_the_family_problem(case: Case) -> None:
    """Without a config the launcher runs the family's default for ``problem_of(inputs)``."""
    inputs = build(case, seed=4)
    problem = FAMILY.problem_of(inputs)
    assert problem == Problem(
        spec_len=max(case.max_k, 1), batch=case.batch, vocab=case.vocab,
        dtype=str(case.dtype).removeprefix("torch."), draft_probs=case.draft_probs,
    )
    config = FAMILY.default_config(problem, backend_of(inputs.target_logits.device))
    assert torch.equal(run(inputs), FAMILY.launch(inputs, config))


def test_problem_of_an_empty_batch_is_the_smallest() -> None:
    inputs = replace(
        build(Case(1, 1, 64, mode="greedy"), seed=0),
        draft_token_ids=torch.zeros(0, dtype=torch.int32, device=DEVICE),
        cu_num_draft_tokens=torch.zeros(0, dtype=torch.int32, device=DEVICE),
        target_logits=torch.zeros(0, 64, device=DEVICE),
        bonus_token_ids=torch.zeros(0, 1, dtype=torch.int64, device=DEVICE),
        max_spec_len=0,
        draft_probs=None,
    )
    assert FAMILY.problem_of(inputs) == Problem(spec_len=1, batch=1, vocab=64,
                                                draft_probs=False)
    assert run(inputs).shape == (0, 1)


def test_supported_vocab_and_dtypes() -> None:
    # The fixed-point denominator of MAX_VOCAB ones fits int64; one more may not.
    assert MAX_VOCAB * 2**FIXED_POINT_BITS < 2**63 <= (MAX_VOCAB + 1) * 2**FIXED_POINT_BITS
    assert [str(d).removeprefix("torch.") for d in LOGITS_DTYPES] == list(DTYPES)
