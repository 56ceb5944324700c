"""``spectune.kernels.sample`` (the fused sampler) against its reference, the unfused
chain of spectune's kernels, vLLM 0.32's own chain (its temperature, min-p, top-k/top-p
and Gumbel kernels, run by the interpreter), itself under every config, and the
distribution it must sample (chi-square, with negative controls).

Rules: equal tokens to spectune's unfused chain, always (same operations, configs that
cannot change a threshold); equal to the reference and to vLLM's chain except at rows the
reference flags as near-ties (spectune/kernels/sampling_reference.py).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from scipy import stats

from spectune.kernels import (
    FAMILIES,
    apply_min_p,
    apply_temperature,
    gumbel_sample,
    sample,
    top_k_top_p,
)
from spectune.kernels.sampling import gumbel_results_agree, sample_reference, top_k_top_p_reference
from spectune.space import InvalidConfigError, Problem
from tests.kernels.conftest import DEVICE, vllm_oracle

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

FAMILY = FAMILIES["sample"]

#: (temperature, min_p, top_k (0: none), top_p) of the request states.
SETTINGS = ((0.8, 0.05, 50, 0.9), (0.0, 0.0, 0, 1.0), (1.0, 0.0, 0, 0.95),
            (0.5, 0.1, 5, 1.0), (1.5, 0.0, 1, 0.5), (2.0, 0.02, 0, 0.3),
            (1e-3, 0.0, 20, 0.99), (0.7, 0.5, 0, 1e-4), (1.0, 0.0, 0, 1.0))
TALLY: Counter[str] = Counter()


def make_case(rows: int, vocab: int, *, seed: int, dtype: torch.dtype = torch.float32,
              padded: bool = False, ties: bool = False) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    states = len(SETTINGS)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    if ties:
        logits = torch.round(logits)
    elif vocab > 4:
        logits[:, :3] += 5
    mapping = torch.randint(0, states, (rows,), generator=gen).to(torch.int32)
    if padded:
        mapping[0] = -1
    return {
        "logits": logits.to(dtype).to(DEVICE),
        "expanded_idx_mapping": mapping.to(DEVICE),
        "temperature": torch.tensor([s[0] for s in SETTINGS], device=DEVICE),
        "min_p": torch.tensor([s[1] for s in SETTINGS], device=DEVICE),
        "top_k": torch.tensor([min(s[2], vocab) or vocab for s in SETTINGS],
                              dtype=torch.int32, device=DEVICE),
        "top_p": torch.tensor([s[3] for s in SETTINGS], device=DEVICE),
        "seed": torch.randint(-2**62, 2**62, (states,), generator=gen).to(DEVICE),
        "pos": torch.randint(0, 2**31, (rows,), generator=gen).to(DEVICE),
    }


def fused(case: dict[str, torch.Tensor], **kwargs: object) -> torch.Tensor:
    return sample(case["logits"], case["expanded_idx_mapping"], case["temperature"],
                  case["min_p"], case["top_k"], case["top_p"], case["seed"], case["pos"],
                  **kwargs)  # type: ignore[arg-type]


def reference(case: dict[str, torch.Tensor], **kwargs: object):
    return sample_reference(case["logits"], case["expanded_idx_mapping"],
                            case["temperature"], case["min_p"], case["top_k"],
                            case["top_p"], case["seed"], case["pos"], **kwargs)  # type: ignore[arg-type]


def per_row(case: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """A request-state parameter expanded to the rows (padded rows: state 0's, unused)."""
    return case[name][case["expanded_idx_mapping"].long().clamp(min=0)]


def unfused(case: dict[str, torch.Tensor], *, temperature: Callable[..., None],
            min_p: Callable[..., None], top_k_top_p_fn: Callable[..., torch.Tensor],
            gumbel: Callable[..., torch.Tensor], use_fp64: bool = False) -> torch.Tensor:
    """Model Runner V2's sampler, step by step: an fp32 copy, temperature and min-p in
    place, top-k/top-p, then Gumbel-max without temperature."""
    mapping = case["expanded_idx_mapping"]
    x = case["logits"].float().clone()
    temperature(x, mapping, case["temperature"])
    min_p(x, mapping, case["min_p"])
    greedy = (mapping < 0) | (per_row(case, "temperature") == 0)
    k = torch.where(greedy, x.shape[1], per_row(case, "top_k")).to(torch.int32)
    p = torch.where(greedy, 1.0, per_row(case, "top_p"))
    x = top_k_top_p_fn(x, k, p)
    return gumbel(x, mapping, case["temperature"], case["seed"], case["pos"], False, False,
                  use_fp64=use_fp64)


def ours_unfused(case: dict[str, torch.Tensor], **kwargs: object) -> torch.Tensor:
    # Padded rows keep their logits: vLLM's kernels would read state -1, ours skip it.
    return unfused(case, temperature=apply_temperature, min_p=apply_min_p,
                   top_k_top_p_fn=top_k_top_p, gumbel=gumbel_sample, **kwargs)  # type: ignore[arg-type]


CASES = [(3, 1, torch.float32, False), (5, 7, torch.float16, True),
         (9, 97, torch.bfloat16, False), (9, 1000, torch.float32, True),
         (6, 4099, torch.bfloat16, False), (3, 32000, torch.float32, True)]


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize(("rows", "vocab", "dtype", "padded"), CASES)
def test_equals_the_unfused_chain_and_the_reference(
    rows: int, vocab: int, dtype: torch.dtype, padded: bool, ties: bool
) -> None:
    case = make_case(rows, vocab, seed=vocab + rows, dtype=dtype, padded=padded, ties=ties)
    for use_fp64 in (False, True):
        got = fused(case, use_fp64=use_fp64)
        assert torch.equal(got.cpu(), ours_unfused(case, use_fp64=use_fp64).cpu())
        ref = reference(case, use_fp64=use_fp64)
        assert gumbel_results_agree(ref, got) == (True, "")
        TALLY["rows vs the unfused chain and the reference"] += rows
        TALLY["near-tie rows"] += int(ref.near_tie.sum())


@pytest.mark.slow
@pytest.mark.parametrize(("vocab", "dtype"), [(128256, torch.bfloat16),
                                              (151936, torch.float32)])
def test_real_vocabularies(vocab: int, dtype: torch.dtype) -> None:
    case = make_case(2, vocab, seed=vocab, dtype=dtype)
    got = fused(case)
    assert torch.equal(got.cpu(), ours_unfused(case).cpu())
    assert gumbel_results_agree(reference(case), got) == (True, "")


@pytest.fixture(scope="module")
def vllm_kernels():
    """vLLM's MRV2 kernels (a missing vllm skips, except in CI: a failure)."""
    from tests.kernels.vllm_mrv2 import load_vllm_mrv2

    return vllm_oracle(load_vllm_mrv2)


@pytest.mark.vllm
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize(("rows", "vocab"), [(5, 7), (9, 97), (9, 1000), (6, 4099),
                                             (3, 32000)])
def test_equals_vllms_sampler_chain(vllm_kernels: object, rows: int, vocab: int,
                                    ties: bool) -> None:
    """vLLM's own temperature, min-p and Gumbel kernels around its sort-based top-k/top-p
    (what its CPU build runs; its Triton top-k/top-p is compared in
    test_top_k_top_p.py): the same tokens but at flagged near-ties."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    case = make_case(rows, vocab, seed=3 * vocab + rows, ties=ties)
    theirs = unfused(case, temperature=vllm_kernels.gumbel.apply_temperature,  # type: ignore[attr-defined]
                     min_p=vllm_kernels.min_p.apply_min_p,  # type: ignore[attr-defined]
                     top_k_top_p_fn=apply_top_k_top_p_pytorch,
                     gumbel=vllm_kernels.gumbel.gumbel_sample)  # type: ignore[attr-defined]
    got = fused(case)
    ref = reference(case)
    assert gumbel_results_agree(ref, theirs) == (True, "")
    assert bool(((got.cpu() == theirs.cpu()) | ref.near_tie).all())
    TALLY["rows vs vLLM's chain"] += rows
    TALLY["rows where vLLM's chain differs (near-ties)"] += int((got.cpu() != theirs.cpu()).sum())


@pytest.mark.parametrize(("rows", "vocab"), [(9, 1000), (5, 4099)])
def test_every_config_gives_the_same_tokens(rows: int, vocab: int) -> None:
    case = make_case(rows, vocab, seed=5 * vocab, ties=True)
    expected = fused(case)
    space = FAMILY.search_space("cpu-interpreter")
    configs = random.Random(1).sample(list(space), 8)
    configs.append(space.validate({"BLOCK_V": 256, "PIVOTS": 4, "num_warps": 1,
                                   "num_stages": 1}))
    for config in configs:
        assert torch.equal(fused(case, config=config).cpu(), expected.cpu()), config
        TALLY["config runs compared"] += 1


# The distribution test: one row of logits, many draws (each row its own position).
_DIST_LOGITS = [2.0, 1.5, 1.2, 1.0, 0.8, 0.5, 0.3, 0.0, -0.5, -1.0, -2.0, -4.0]
_DIST_SETTINGS = {"T=0.8,min_p=0.05,k=8,p=0.9": (0.8, 0.05, 8, 0.9),
                  "T=1.3,k=4": (1.3, 0.0, 4, 1.0)}
# Draws per setting: each is one program in the interpreter (~0.05 s). 600 keep both
# settings' negative controls far below POWER_ALPHA (p-values 1.2e-9 and 2e-65 with
# these seeds; the draws are counter-based, so the same on every run) at half the time.
_DRAWS = 600
ALPHA = 1e-3
POWER_ALPHA = 1e-6


def _draws(setting: tuple[float, float, int, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens of ``_DRAWS`` rows of the same logits, and the distribution they must
    follow (the reference chain's masked softmax, float64)."""
    temp, min_p, k, p = setting
    vocab = len(_DIST_LOGITS)
    logits = torch.tensor([_DIST_LOGITS] * _DRAWS)
    case = {
        "logits": logits.to(DEVICE),
        "expanded_idx_mapping": torch.zeros(_DRAWS, dtype=torch.int32, device=DEVICE),
        "temperature": torch.tensor([temp], device=DEVICE),
        "min_p": torch.tensor([min_p], device=DEVICE),
        "top_k": torch.tensor([k], dtype=torch.int32, device=DEVICE),
        "top_p": torch.tensor([p], device=DEVICE),
        "seed": torch.tensor([1234], device=DEVICE),
        "pos": torch.arange(_DRAWS, device=DEVICE),
    }
    x = torch.tensor([_DIST_LOGITS]) / temp
    if min_p:
        x = torch.where(x < x.max() + torch.log(torch.tensor(min_p)), float("-inf"), x)
    kept = top_k_top_p_reference(x, torch.tensor([k]), torch.tensor([p]))
    assert not bool(kept.ambiguous.any())
    probs = torch.softmax(kept.logits[0].double(), dim=0)
    assert probs.numel() == vocab
    return fused(case).cpu(), probs


def chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of ``tokens`` following ``probs``; tokens of probability 0 fail outright."""
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    assert float(counts[probs == 0].sum()) == 0, "a masked token was sampled"
    support = probs > 0
    if int(support.sum()) == 1:
        return 1.0
    expected = probs[support] * counts.sum()
    assert bool((expected >= 5).all())
    return float(stats.chisquare(counts[support].numpy(), expected.numpy()).pvalue)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(_DIST_SETTINGS))
def test_tokens_follow_the_processed_distribution(name: str) -> None:
    tokens, probs = _draws(_DIST_SETTINGS[name])
    pvalue = chi_square(tokens, probs)
    print(f"\nsample [{name}] chi-square over {_DRAWS} draws, {int((probs > 0).sum())} "
          f"kept tokens: p-value {pvalue:.3g}")
    TALLY[f"chi-square p-value x1000 [{name}]"] = round(pvalue * 1000)
    assert pvalue > ALPHA
    # Negative control: the same draws reject the distribution without min-p, top-k and
    # top-p (what a sampler that ignored them would give).
    unmasked = torch.softmax(torch.tensor(_DIST_LOGITS, dtype=torch.float64)
                             / _DIST_SETTINGS[name][0], dim=0)
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    wrong = stats.chisquare(counts.numpy(), (unmasked * counts.sum()).numpy()).pvalue
    print(f"sample [{name}] negative control (filters ignored): p-value {wrong:.3g}")
    assert wrong < POWER_ALPHA, wrong


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c.update(logits=c["logits"].long()), "logits must have dtype"),
        (lambda c: c.update(top_k=c["top_k"][:2]), "top_k must have shape"),
        (lambda c: c.update(min_p=c["min_p"].double()), "min_p must have dtype"),
        (lambda c: c.update(pos=c["pos"][:1]), "pos must have shape"),
        (lambda c: c["expanded_idx_mapping"].fill_(99), "expanded_idx_mapping must index"),
        (lambda c: c["temperature"].fill_(-1.0), "temperature must be finite"),
        (lambda c: c["min_p"].fill_(2.0), r"min_p must be in \[0, 1\]"),
        (lambda c: c["top_p"].fill_(0.0), r"top_p must be in \(0, 1\]"),
    ],
)
def test_bad_arguments_name_themselves(change: Callable[[dict], None], message: str) -> None:
    case = make_case(3, 64, seed=1)
    change(case)
    with pytest.raises(ValueError, match=message):
        fused(case)


def test_bad_config_is_refused() -> None:
    with pytest.raises(InvalidConfigError):
        fused(make_case(3, 64, seed=1), config={"BLOCK_V": 100})


@pytest.mark.parametrize(
    "problem",
    [Problem(spec_len=1, batch=4, vocab=1000, draft_probs=False),
     Problem(spec_len=1, batch=2, vocab=97, dtype="bfloat16", draft_probs=False)],
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


def test_zz_tally() -> None:
    """The counts of this module's comparisons (run last; shown with -s)."""
    for name, count in sorted(TALLY.items()):
        print(f"sample: {name}: {count}")
