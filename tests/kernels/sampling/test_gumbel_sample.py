"""``spectune.kernels.gumbel_sample`` against vLLM 0.32's MRV2 ``gumbel_sample``, its
reference, and itself under every config.

vLLM's function is its own source (``vllm/v1/worker/gpu/sample/gumbel.py``) bound to the
real Triton and run by the interpreter (tests/kernels/vllm_mrv2.py). Both compute each
token's score with the same operations and vLLM's counter-based noise, so tokens are
compared for equality, and with the PyTorch reference up to its flagged near-ties.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

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


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("rows", "vocab", "dtype", "padded"),
    [
        (1, 1, torch.float32, False),
        (3, 7, torch.float16, True),
        (5, 97, torch.bfloat16, False),
        (4, 1000, torch.float32, True),
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


@pytest.mark.vllm
@pytest.mark.parametrize("per_token_col", [False, True], ids=["scalar-col", "per-token-col"])
def test_logits_cache_is_written_as_vllm_defines_it(
    vllm_gumbel: object, per_token_col: bool
) -> None:
    """A drafter's cache: the source logits (before temperature) at (state, column) of
    every row, padded rows skipped, nothing else touched; the tokens are those of vLLM's
    call without a cache. (vLLM's own cache store does not run under the interpreter: it
    masks a store with a scalar, which the interpreter refuses.)"""
    case = make_case(4, 300, seed=3, dtype=torch.bfloat16, padded=True)
    gen = torch.Generator().manual_seed(4)
    source = (torch.randn(4, 300, generator=gen) * 2).to(torch.bfloat16).to(DEVICE)
    cols = torch.tensor([0, 2, 1, 2]) if per_token_col else torch.tensor([1, 1, 1, 1])
    col = (cols if per_token_col else torch.tensor(1)).to(DEVICE)
    cache = torch.full((7, 3, 301), 7.0, dtype=torch.bfloat16, device=DEVICE)
    ours = call(gumbel_sample, case, is_drafting=True, logits_cache=cache,
                logits_cache_col=col, logits_cache_source=source)
    theirs = call(vllm_gumbel, case, is_drafting=True)
    assert torch.equal(ours.cpu(), theirs.cpu())
    expected = torch.full((7, 3, 301), 7.0, dtype=torch.bfloat16)
    for row, state in enumerate(case["expanded_idx_mapping"].tolist()):
        if state >= 0:
            expected[state, int(cols[row]), :300] = source[row].cpu()
    assert torch.equal(cache.cpu(), expected)


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
