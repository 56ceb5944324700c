"""``spectune.kernels.apply_min_p`` against vLLM 0.32's MRV2 ``apply_min_p``, its
reference, and itself under every config.

vLLM's function is its own source (``vllm/v1/worker/gpu/sample/min_p.py``) bound to the
real Triton and run by the interpreter (tests/kernels/vllm_mrv2.py). Both take the exact
row max and the threshold ``max + tl.log(min_p)`` in float32, so results are compared
bit for bit with vLLM's, and with the PyTorch reference but at its flagged near-ties
(PyTorch's ``log`` may differ from the device's by an ulp). vLLM's kernel would read
``min_p[-1]`` for a padded row (state ``-1``), which ours leaves untouched; vLLM is given
such rows at a state of ``min_p`` 0 instead, which its kernel skips.
"""

from __future__ import annotations

import random

import pytest
import torch

from spectune.kernels import FAMILIES, apply_min_p
from spectune.kernels.sampling import (
    MinPInputs,
    MinPReference,
    min_p_reference,
    min_p_results_agree,
)
from spectune.space import InvalidConfigError, Problem
from tests.kernels.conftest import DEVICE, bits, vllm_oracle, vllm_state_step

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

FAMILY = FAMILIES["min_p"]
SEARCH_SPACE = FAMILY.space.SEARCH_SPACE  # type: ignore[attr-defined]
MIN_PS = (0.0, 1e-4, 0.05, 0.5, 1.0, 0.1)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INF = float("inf")


def make_case(
    rows: int, vocab: int, *, seed: int, dtype: torch.dtype = torch.float32,
    padded: bool = False, states_extra: int = 3,
) -> dict[str, torch.Tensor]:
    """Random logits with a few likely tokens (some ``-inf``) over ``rows`` rows whose
    requests take every ``min_p`` of :data:`MIN_PS` in turn (from a seeded offset)."""
    gen = torch.Generator().manual_seed(seed)
    states = rows + states_extra
    logits = torch.randn(rows, vocab, generator=gen) * 3
    if vocab > 4:
        peaks = torch.randint(0, vocab, (rows, 3), generator=gen)
        logits.scatter_add_(1, peaks, torch.full((rows, 3), 6.0))
        logits[:, 3::11] = -INF
    mapping = torch.randperm(states, generator=gen)[:rows].to(torch.int32)
    if padded:
        mapping[0] = -1
    first = int(torch.randint(0, len(MIN_PS), (), generator=gen))
    min_p = torch.tensor([MIN_PS[(first + s) % len(MIN_PS)] for s in range(states)],
                         dtype=torch.float32)
    return {
        "logits": logits.to(dtype).to(DEVICE),
        "expanded_idx_mapping": mapping.to(DEVICE),
        "min_p": min_p.to(DEVICE),
    }


def ours(case: dict[str, torch.Tensor], **kwargs: object) -> torch.Tensor:
    """Our kernels, in place on a copy of the case's logits."""
    logits = case["logits"].clone()
    apply_min_p(logits, case["expanded_idx_mapping"], case["min_p"], **kwargs)
    return logits


@pytest.fixture(scope="module")
def vllm_min_p() -> object:
    """vLLM's MRV2 ``apply_min_p`` (a missing vllm skips, except in CI: a failure)."""
    from tests.kernels.vllm_mrv2 import load_vllm_mrv2

    return vllm_oracle(lambda: load_vllm_mrv2().min_p.apply_min_p)


def theirs(fn: object, case: dict[str, torch.Tensor]) -> torch.Tensor:
    """vLLM's kernel, in place on a copy; padded rows at an extra state of min_p 0."""
    return vllm_state_step(fn, case["logits"], case["expanded_idx_mapping"],  # type: ignore[arg-type]
                           case["min_p"])


@pytest.mark.vllm
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize(
    ("rows", "vocab", "padded"),
    [
        (1, 1, False),
        (3, 7, True),
        (7, 97, False),
        (4, 1000, True),
        (7, 4099, True),
        (2, 32000, True),
        pytest.param(2, 151936, True, marks=pytest.mark.slow),
    ],
)
def test_logits_are_vllms(
    vllm_min_p: object, rows: int, vocab: int, dtype: torch.dtype, padded: bool
) -> None:
    """The default config (split rows for these small batches) and vLLM's own launch
    (one program per row)."""
    case = make_case(rows, vocab, seed=vocab + rows, dtype=dtype, padded=padded)
    expected = theirs(vllm_min_p, case)
    ref = min_p_reference(**case)
    for config in (None, {"BLOCK_V": 1024, "SPLITS": 1, "num_warps": 4, "num_stages": 2}):
        got = ours(case, config=config)
        assert torch.equal(bits(got), bits(expected)), config
        assert min_p_results_agree(ref, got) == (True, ""), config


@pytest.mark.vllm
def test_special_rows_are_vllms(vllm_min_p: object) -> None:
    """Rows of ties, infinities and extremes under every min_p (and padded)."""
    rows = torch.tensor([
        [0.0, -0.0, 2.0, 2.0, -INF, 1.0, 2.0 - 1e-3, -3.0],  # tied maxima
        [-INF] * 8,  # nothing finite: the threshold is -inf, nothing masked
        [1.0, INF, -INF, 5.0, -5.0, 0.0, INF, 3e4],  # +inf max: only +inf kept
        [3e4, -6e4, 6e4, 1e-6, -1e-6, 5.9e4, 6.5e4 - 1e3, 0.0],  # large (fp16's range)
    ])
    for dtype in DTYPES:
        logits = rows.to(dtype).to(DEVICE)
        for state in (-1, *range(len(MIN_PS))):
            case = {
                "logits": logits,
                "expanded_idx_mapping": torch.full((rows.shape[0],), state, dtype=torch.int32,
                                                   device=DEVICE),
                "min_p": torch.tensor(MIN_PS, device=DEVICE),
            }
            got = ours(case)
            assert torch.equal(bits(got), bits(theirs(vllm_min_p, case))), (dtype, state)
            assert min_p_results_agree(min_p_reference(**case), got) == (True, ""), state
            if state >= 0 and MIN_PS[state] == 1.0:  # only each row's maxima stay
                top = logits.max(dim=1, keepdim=True).values
                kept = torch.where(logits == top, logits, -INF)
                assert torch.equal(bits(got), bits(kept)), dtype


def test_skipped_rows_are_neither_read_nor_written() -> None:
    """Rows at min_p 0 and padded rows: ``out`` keeps whatever it held, the others are
    the filtered logits, under one or several splits; ``logits`` are only read."""
    case = make_case(4, 3000, seed=5, dtype=torch.bfloat16)
    case["expanded_idx_mapping"] = torch.tensor([0, -1, 1, 2], dtype=torch.int32,
                                                device=DEVICE)
    case["min_p"] = torch.tensor([0.0, 0.05, 0.0], device=DEVICE)
    before = case["logits"].clone()
    ref = min_p_reference(**case)
    for splits in (1, 4):
        out = torch.full_like(case["logits"], 7.0)
        apply_min_p(**case, out=out, config={"BLOCK_V": 256, "SPLITS": splits,
                                             "num_warps": 1, "num_stages": 1})
        assert torch.equal(bits(case["logits"]), bits(before))
        assert torch.equal(bits(out[2]), bits(ref.logits[2]))
        assert bool(out[2].isneginf().any()) and bool((out[2] > -INF).any())
        for row in (0, 1, 3):
            assert bool((out[row] == 7.0).all()), (splits, row)


def test_the_row_max_anywhere_across_splits() -> None:
    """The row max in the first, a middle or the last chunk (or the last logit) sets the
    threshold for every chunk."""
    vocab = 3001
    for where in (0, 1500, 2999, 3000):
        logits = torch.zeros(1, vocab)
        logits[0, where] = 10.0
        logits[0, 7] = 9.99  # kept: 9.99 > 10 + log(0.5)
        case = {"logits": logits.to(DEVICE),
                "expanded_idx_mapping": torch.zeros(1, dtype=torch.int32, device=DEVICE),
                "min_p": torch.tensor([0.5], device=DEVICE)}
        for splits in (1, 2, 8, 256):
            got = ours(case, config={"BLOCK_V": 256, "SPLITS": splits, "num_warps": 1,
                                     "num_stages": 1}).cpu()[0]
            kept = torch.nonzero(got > -INF).flatten().tolist()
            assert kept == sorted({where, 7}), (where, splits)


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


@pytest.mark.parametrize(("rows", "vocab", "dtype"),
                         [(5, 1000, torch.float32), (3, 4099, torch.bfloat16),
                          (2, 97, torch.float16)])
def test_every_config_gives_the_same_logits(rows: int, vocab: int, dtype: torch.dtype) -> None:
    case = make_case(rows, vocab, seed=7 * vocab, dtype=dtype, padded=True)
    expected = ours(case)
    assert min_p_results_agree(min_p_reference(**case), expected) == (True, "")
    for config in _sampled_configs(12):
        assert torch.equal(bits(ours(case, config=config)), bits(expected)), config


def test_reference_flags_near_ties() -> None:
    """A logit at the threshold (up to the device's log) is a near-tie: kept in the
    reference, and -inf agrees there too; one ulp elsewhere does not."""
    threshold = float(torch.tensor(4.0) + torch.log(torch.tensor(0.25)))
    logits = torch.tensor([[4.0, threshold, threshold - 0.5, 3.5]])
    ref = min_p_reference(logits, torch.tensor([0]), torch.tensor([0.25]))
    assert ref.near_tie.tolist() == [[False, True, False, False]]
    assert ref.logits.tolist() == [[4.0, threshold, -INF, 3.5]]
    either = torch.tensor([[4.0, -INF, -INF, 3.5]])
    assert min_p_results_agree(ref, either) == (True, "")
    off = ref.logits.clone()
    off.view(torch.int32)[0, 3] ^= 1
    ok, message = min_p_results_agree(ref, off)
    assert not ok and "[0, 3]" in message
    assert not min_p_results_agree(ref, ref.logits.half())[0]


def test_empty_batch() -> None:
    case = make_case(1, 50, seed=0)
    case["logits"] = case["logits"][:0]
    case["expanded_idx_mapping"] = case["expanded_idx_mapping"][:0]
    assert ours(case).shape == (0, 50)


def test_strided_rows() -> None:
    """Row slices of a wider buffer (vLLM passes such views): only the view changes."""
    case = make_case(4, 200, seed=3, padded=True)
    wide = torch.full((4, 256), 5.0, device=DEVICE)
    wide[:, :200] = case["logits"]
    view = wide[:, :200]
    apply_min_p(view, case["expanded_idx_mapping"], case["min_p"],
                config={"BLOCK_V": 256, "SPLITS": 1, "num_warps": 1, "num_stages": 1})
    assert min_p_results_agree(min_p_reference(**case), view) == (True, "")
    assert bool((wide[:, 200:] == 5.0).all())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(logits=c["logits"].long()), "logits must have dtype"),
        (lambda c: c.update(logits=c["logits"][:, ::2]), "logits must be contiguous in"),
        (lambda c: c.update(logits=c["logits"][0]), "logits must be 2-D"),
        (lambda c: c.update(logits=c["logits"][:, :0]), "logits: vocab size"),
        (lambda c: c.update(expanded_idx_mapping=c["expanded_idx_mapping"][:1]),
         "expanded_idx_mapping must have shape"),
        (lambda c: c.update(expanded_idx_mapping=c["expanded_idx_mapping"].float()),
         "expanded_idx_mapping must have dtype"),
        (lambda c: c.update(min_p=c["min_p"].half()), "min_p must have dtype"),
        (lambda c: c.update(min_p=c["min_p"][None]), "min_p must be 1-D"),
        (lambda c: c.update(min_p=0.1), "min_p must be a torch.Tensor"),
        (lambda c: c.update(out=c["logits"].half()), "out must have dtype"),
        (lambda c: c.update(out=c["logits"][:1]), "out must have shape"),
        (lambda c: c["expanded_idx_mapping"].fill_(99), "expanded_idx_mapping must index"),
        (lambda c: c["expanded_idx_mapping"].fill_(-2), "expanded_idx_mapping must index"),
        (lambda c: c["min_p"].fill_(-0.1), "min_p must be in"),
        (lambda c: c["min_p"].fill_(1.5), "min_p must be in"),
        (lambda c: c["min_p"].fill_(float("nan")), "min_p must be in"),
    ],
)
def test_bad_arguments_name_themselves(change: object, message: str) -> None:
    case = make_case(3, 64, seed=1)
    change(case)  # type: ignore[operator]
    before = case["logits"].clone()
    with pytest.raises(ValueError, match=message):
        apply_min_p(**case)
    assert torch.equal(case["logits"], before)  # nothing launched


def test_bad_config_and_validate_false() -> None:
    case = make_case(3, 64, seed=1)
    with pytest.raises(InvalidConfigError):
        ours(case, config={"BLOCK_V": 256, "SPLITS": 3, "num_warps": 1, "num_stages": 1})
    with pytest.raises(InvalidConfigError):
        ours(case, config={"BLOCK_V": 256, "SPLITS": 1, "num_warps": 8, "num_stages": 1})
    # validate=False skips the content checks: min_p above 1 masks even the max.
    case["min_p"].fill_(2.0)
    case["expanded_idx_mapping"] = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE)
    assert bool(ours(case, validate=False).isneginf().all())


def test_space_and_default() -> None:
    big = FAMILY.default_config(Problem(spec_len=1, batch=512, vocab=151936), "cuda")
    assert big == {"BLOCK_V": 1024, "SPLITS": 1, "num_warps": 4, "num_stages": 2}
    small = FAMILY.default_config(Problem(spec_len=1, batch=1, vocab=151936), "cuda")
    assert small["BLOCK_V"] == 1024 and small["SPLITS"] == 128
    assert FAMILY.default_config(Problem(spec_len=1, batch=1, vocab=97), "hip")["SPLITS"] == 1
    assert "waves_per_eu" in [p.name for p in FAMILY.search_space("hip").params]
    assert "waves_per_eu" not in [p.name for p in FAMILY.search_space("cuda").params]


@pytest.mark.parametrize(
    "problem",
    [Problem(spec_len=1, batch=3, vocab=1000, draft_probs=False),
     Problem(spec_len=1, batch=1, vocab=97, dtype="bfloat16", draft_probs=False),
     Problem(spec_len=1, batch=9, vocab=4099, dtype="float16", draft_probs=False)],
)
def test_family_adapter(problem: Problem) -> None:
    inputs = FAMILY.make_inputs(problem, seed=0, device=DEVICE)
    assert isinstance(inputs, MinPInputs)
    assert FAMILY.problem_of(inputs) == problem
    logits = inputs.logits.clone()
    ref = FAMILY.reference(inputs)
    assert isinstance(ref, MinPReference)
    # The tuner launches again and again on the same inputs: every launch is exact.
    for config in (FAMILY.default_config(problem, "cpu-interpreter"),
                   {"BLOCK_V": 256, "SPLITS": 4, "num_warps": 1, "num_stages": 1},
                   FAMILY.default_config(problem, "cpu-interpreter")):
        out = FAMILY.launch(inputs, config)
        assert FAMILY.same(ref, out), config
        assert torch.equal(bits(inputs.logits), bits(logits))  # the inputs stay unchanged
    assert bool(out.isneginf().any())  # the first row is filtered: real work
    assert FAMILY.same(out.clone(), out)
    changed = out.clone()
    changed[0] = -INF
    assert not FAMILY.same(ref, changed)
    assert not FAMILY.same(out, changed)
