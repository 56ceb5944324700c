"""``spectune.kernels.apply_temperature`` against vLLM 0.32's MRV2 ``apply_temperature``,
its reference, and itself under every config.

vLLM's function is its own source (``vllm/v1/worker/gpu/sample/gumbel.py``) bound to the
real Triton and run by the interpreter (tests/kernels/vllm_mrv2.py). Both compute each
logit with the same float32 operations, so results are compared bit for bit, with vLLM's
and with the PyTorch reference. vLLM's kernel would read ``temperature[-1]`` for a padded
row (state ``-1``), which ours leaves untouched; vLLM is given such rows at a state of
temperature 0 instead, which its kernel skips.
"""

from __future__ import annotations

import random

import pytest
import torch

from spectune.kernels import FAMILIES, apply_temperature
from spectune.kernels.sampling import (
    TEMPERATURE_DEVICE_ULPS,
    TemperatureInputs,
    TemperatureReference,
    temperature_reference,
    temperature_results_agree,
)
from spectune.space import InvalidConfigError, Problem
from tests.kernels.conftest import BITS, DEVICE, bits, vllm_oracle, vllm_state_step

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

FAMILY = FAMILIES["temperature"]
SEARCH_SPACE = FAMILY.space.SEARCH_SPACE  # type: ignore[attr-defined]
# Greedy and unscaled rows (skipped), tiny (overflowing fp16/bf16 to inf), large, usual.
TEMPERATURES = (0.0, 1.0, 1e-6, 1e-3, 0.5, 0.7, 1.3, 2.0, 1e4)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def make_case(
    rows: int, vocab: int, *, seed: int, dtype: torch.dtype = torch.float32,
    padded: bool = False, states_extra: int = 3,
) -> dict[str, torch.Tensor]:
    """Random logits (some ``-inf``) over ``rows`` rows whose requests take every
    temperature of :data:`TEMPERATURES` in turn (from a seeded offset)."""
    gen = torch.Generator().manual_seed(seed)
    states = rows + states_extra
    logits = torch.randn(rows, vocab, generator=gen) * 3
    if vocab > 4:
        logits[:, :4] += 2  # a few likely tokens
        logits[:, 3::11] = float("-inf")
    mapping = torch.randperm(states, generator=gen)[:rows].to(torch.int32)
    if padded:
        mapping[0] = -1
    first = int(torch.randint(0, len(TEMPERATURES), (), generator=gen))
    temperature = torch.tensor(
        [TEMPERATURES[(first + s) % len(TEMPERATURES)] for s in range(states)],
        dtype=torch.float32,
    )
    return {
        "logits": logits.to(dtype).to(DEVICE),
        "expanded_idx_mapping": mapping.to(DEVICE),
        "temperature": temperature.to(DEVICE),
    }


def ours(case: dict[str, torch.Tensor], **kwargs: object) -> torch.Tensor:
    """Our kernel, in place on a copy of the case's logits."""
    logits = case["logits"].clone()
    apply_temperature(logits, case["expanded_idx_mapping"], case["temperature"], **kwargs)
    return logits


@pytest.fixture(scope="module")
def vllm_temperature() -> object:
    """vLLM's MRV2 ``apply_temperature`` (a missing vllm skips, except in CI: a failure)."""
    from tests.kernels.vllm_mrv2 import load_vllm_mrv2

    return vllm_oracle(lambda: load_vllm_mrv2().gumbel.apply_temperature)


def theirs(fn: object, case: dict[str, torch.Tensor]) -> torch.Tensor:
    """vLLM's kernel, in place on a copy; padded rows at an extra state of temperature 0."""
    return vllm_state_step(fn, case["logits"], case["expanded_idx_mapping"],  # type: ignore[arg-type]
                           case["temperature"])


@pytest.mark.vllm
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize(
    ("rows", "vocab", "padded"),
    [
        (1, 1, False),
        (3, 7, True),
        (9, 97, False),
        (4, 1000, True),
        (9, 4099, True),
        (3, 32000, True),
        pytest.param(2, 151936, True, marks=pytest.mark.slow),
    ],
)
def test_logits_are_vllms(
    vllm_temperature: object, rows: int, vocab: int, dtype: torch.dtype, padded: bool
) -> None:
    case = make_case(rows, vocab, seed=vocab + rows, dtype=dtype, padded=padded)
    got = ours(case)
    assert torch.equal(bits(got), bits(theirs(vllm_temperature, case)))
    ref = temperature_reference(**case)
    assert temperature_results_agree(ref, got) == (True, "")
    assert not torch.equal(bits(got), bits(case["logits"])) or vocab == 1 or rows == 1


@pytest.mark.vllm
def test_every_temperature_on_one_row_is_vllms(vllm_temperature: object) -> None:
    """Each temperature alone (and a padded row), over a row of every float class:
    zeros of both signs, tiny and huge values, infinities."""
    special = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1.5, -2.25, 3e4, -6e4, 3e38, -3e38,
                            float("inf"), float("-inf")])
    for dtype in DTYPES:
        row = special.to(dtype)
        for state in (-1, *range(len(TEMPERATURES))):
            case = {
                "logits": row[None].to(DEVICE),
                "expanded_idx_mapping": torch.tensor([state], dtype=torch.int64,
                                                     device=DEVICE),
                "temperature": torch.tensor(TEMPERATURES, device=DEVICE),
            }
            got = ours(case)
            assert torch.equal(bits(got), bits(theirs(vllm_temperature, case))), (dtype, state)
            ref = temperature_reference(**case)
            assert temperature_results_agree(ref, got) == (True, ""), (dtype, state)


def test_skipped_rows_are_neither_read_nor_written() -> None:
    """Rows at temperature 0 or 1 and padded rows: ``out`` keeps whatever it held, the
    others are the scaled logits; ``logits`` are only read."""
    case = make_case(6, 300, seed=5, dtype=torch.bfloat16)
    case["expanded_idx_mapping"] = torch.tensor([0, 1, -1, 2, 3, 4], dtype=torch.int32,
                                                device=DEVICE)
    case["temperature"] = torch.tensor([0.0, 1.0, 0.5, 2.0, 1.0], device=DEVICE)
    before = case["logits"].clone()
    out = torch.full_like(case["logits"], 7.0)
    apply_temperature(**case, out=out, config={"BLOCK_V": 256, "num_warps": 1,
                                               "num_stages": 1})
    assert torch.equal(bits(case["logits"]), bits(before))
    ref = temperature_reference(**case)
    for row in range(6):
        if row in (3, 4):  # states 2 and 3: scaled
            assert torch.equal(bits(out[row]), bits(ref.logits[row]))
            assert not torch.equal(bits(out[row]), bits(before[row]))
        else:
            assert bool((out[row] == 7.0).all()), row


def test_reference_rule_per_backend() -> None:
    """Under the interpreter every logit is exact (bfloat16 stores truncate there); on a
    GPU a scaled logit may be the device's division's ulps off (stored to nearest even),
    an unscaled row never."""
    logits = torch.tensor([[1.0, -3.0, 7.0, 0.0], [5.0, 6.0, 7.0, 8.0]])
    mapping = torch.tensor([0, 1])
    temperature = torch.tensor([0.3, 1.0])
    exact = temperature_reference(logits, mapping, temperature)
    gpu = temperature_reference(logits, mapping, temperature, backend="cuda")
    assert torch.equal(exact.logits, gpu.logits)
    assert exact.low is exact.logits and exact.high is exact.logits
    for ulps, ok in ((1, True), (TEMPERATURE_DEVICE_ULPS, True),
                     (TEMPERATURE_DEVICE_ULPS + 1, False)):
        off = exact.logits.clone()
        off.view(torch.int32)[0, :3] += ulps  # further from zero
        assert temperature_results_agree(gpu, off)[0] is ok, ulps
        assert not temperature_results_agree(exact, off)[0]
    unscaled = exact.logits.clone()
    unscaled.view(torch.int32)[1, 0] += 1
    assert not temperature_results_agree(gpu, unscaled)[0]
    # 4093750 = 4.09375 / 1e-6: bfloat16 stores 4079616 by truncation, 4096000 to nearest.
    x = torch.tensor([[4.09375]], dtype=torch.bfloat16)
    one, tiny = torch.tensor([0]), torch.tensor([1e-6])
    assert temperature_reference(x, one, tiny).logits.item() == 4079616.0
    assert temperature_reference(x, one, tiny, backend="cuda").logits.item() == 4096000.0
    assert temperature_results_agree(temperature_reference(x, one, tiny),
                                     torch.tensor([[4096000.0]], dtype=torch.bfloat16))[0] \
        is False


def _sampled_configs(count: int) -> list[dict[str, int]]:
    space = FAMILY.search_space("cpu-interpreter")
    configs = list(space)
    rng = random.Random(0)
    picked = rng.sample(configs, min(count, len(configs)))
    for block in SEARCH_SPACE.param("BLOCK_V").values:
        picked.append(space.validate({"BLOCK_V": block, "num_warps": 1, "num_stages": 1}))
    return picked


@pytest.mark.parametrize(("rows", "vocab", "dtype"),
                         [(5, 1000, torch.float32), (4, 4099, torch.bfloat16),
                          (3, 97, torch.float16)])
def test_every_config_gives_the_same_logits(rows: int, vocab: int, dtype: torch.dtype) -> None:
    case = make_case(rows, vocab, seed=7 * vocab, dtype=dtype, padded=True)
    expected = ours(case)
    assert temperature_results_agree(temperature_reference(**case), expected) == (True, "")
    for config in _sampled_configs(12):
        assert torch.equal(bits(ours(case, config=config)), bits(expected)), config


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
    apply_temperature(view, case["expanded_idx_mapping"], case["temperature"])
    assert temperature_results_agree(temperature_reference(**case), view) == (True, "")
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
        (lambda c: c.update(temperature=c["temperature"].double()), "temperature must have"),
        (lambda c: c.update(temperature=c["temperature"][None]), "temperature must be 1-D"),
        (lambda c: c.update(temperature=[1.0]), "temperature must be a torch.Tensor"),
        (lambda c: c.update(out=c["logits"].half()), "out must have dtype"),
        (lambda c: c.update(out=c["logits"][:1]), "out must have shape"),
        (lambda c: c["expanded_idx_mapping"].fill_(99), "expanded_idx_mapping must index"),
        (lambda c: c["expanded_idx_mapping"].fill_(-2), "expanded_idx_mapping must index"),
        (lambda c: c["temperature"].fill_(-1.0), "temperature must be finite"),
        (lambda c: c["temperature"].fill_(float("inf")), "temperature must be finite"),
        (lambda c: c["temperature"].fill_(float("nan")), "temperature must be finite"),
    ],
)
def test_bad_arguments_name_themselves(change: object, message: str) -> None:
    case = make_case(3, 64, seed=1)
    change(case)  # type: ignore[operator]
    before = case["logits"].clone() if isinstance(case["logits"], torch.Tensor) else None
    with pytest.raises(ValueError, match=message):
        apply_temperature(**case)
    if before is not None:
        assert torch.equal(case["logits"], before)  # nothing launched


def test_bad_config_and_validate_false() -> None:
    case = make_case(3, 64, seed=1)
    with pytest.raises(InvalidConfigError):
        ours(case, config={"BLOCK_V": 100})
    with pytest.raises(InvalidConfigError):
        ours(case, config={"BLOCK_V": 256, "num_warps": 8, "num_stages": 1})  # 64 * 8 > 256
    # validate=False skips the content checks (a negative temperature divides anyway).
    case["temperature"].fill_(-2.0)
    got = ours(case, validate=False)
    assert torch.equal(bits(got), bits(-case["logits"] / 2))


def test_space_and_default() -> None:
    assert FAMILY.default_config(Problem(spec_len=1, batch=4, vocab=151936), "cuda") == {
        "BLOCK_V": 8192, "num_warps": 4, "num_stages": 2,
    }
    assert "waves_per_eu" in FAMILY.default_config(Problem(spec_len=1, batch=4, vocab=97),
                                                   "hip")
    assert "waves_per_eu" not in [p.name for p in FAMILY.search_space("cuda").params]
    assert "waves_per_eu" in [p.name for p in FAMILY.search_space("hip").params]


@pytest.mark.parametrize(
    "problem",
    [Problem(spec_len=1, batch=3, vocab=1000, draft_probs=False),
     Problem(spec_len=1, batch=1, vocab=97, dtype="bfloat16", draft_probs=False),
     Problem(spec_len=1, batch=9, vocab=4099, dtype="float16", draft_probs=False)],
)
def test_family_adapter(problem: Problem) -> None:
    inputs = FAMILY.make_inputs(problem, seed=0, device=DEVICE)
    assert isinstance(inputs, TemperatureInputs)
    assert FAMILY.problem_of(inputs) == problem
    logits = inputs.logits.clone()
    ref = FAMILY.reference(inputs)
    assert isinstance(ref, TemperatureReference)
    # The tuner launches again and again on the same inputs: every launch is exact.
    for config in (FAMILY.default_config(problem, "cpu-interpreter"),
                   {"BLOCK_V": 256, "num_warps": 1, "num_stages": 1},
                   FAMILY.default_config(problem, "cpu-interpreter")):
        out = FAMILY.launch(inputs, config)
        assert FAMILY.same(ref, out), config
        assert torch.equal(bits(inputs.logits), bits(logits))  # the inputs stay unchanged
    assert not torch.equal(bits(out), bits(logits))  # the first row is scaled: real work
    changed = out.clone()
    changed.view(BITS[changed.dtype])[0, 0] ^= 1  # one ulp off
    assert not FAMILY.same(ref, changed)
    assert FAMILY.same(out.clone(), out) and not FAMILY.same(out, changed)
