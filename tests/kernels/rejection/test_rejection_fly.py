"""vLLM 0.33's FLy windows in ``spectune.kernels.rejection_sample``, and its ``vllm_version=``.

Against the PyTorch reference (:func:`~spectune.kernels.rejection.rejection_sample_reference`
with FLy: vLLM's deferral rule, the entropy from torch's float32 softmax), up to the
reference's near-ties; every config gives the same tokens; the folded form gives the
tokens of applying the parameters first; rows that must never defer do not. The
comparisons with vLLM 0.33's own kernels are tests/kernels/rejection/test_rejection_vs_vllm.py's
(its second session).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch

from spectune.kernels import FAMILIES, rejection_sample
from spectune.kernels.rejection import (
    RejectionInputs,
    decision_margins_agree,
    draw_sampling_params,
    fly_entropy,
    process_v1,
    rejection_sample_reference,
)

# White-box: the 0.32 launcher the public one runs without a window.
from spectune.kernels.rejection.rejection_sample import rejection_sample as launcher_032
from tests.kernels.conftest import DEVICE, Case, build, on_device

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

FAMILY = FAMILIES["rejection_sample"]
SMALL_TILE = {"BLOCK_V": 256, "SPLITS": 1, "num_warps": 1, "num_stages": 1}
#: How many requests FLy changed (against the same inputs without it), per test.
CHANGED: Counter[str] = Counter()


def with_fly(inputs: RejectionInputs, window: int, threshold: float,
             top_k: int = 3) -> RejectionInputs:
    return replace(inputs, fly_window_size=window, fly_entropy_threshold=threshold,
                   fly_entropy_top_k=top_k)


def run(inputs: RejectionInputs, config: dict[str, int] | None = None,
        **kwargs: object) -> torch.Tensor:
    return rejection_sample(*inputs.args(), **inputs.kwargs(), config=config,
                            vllm_version="0.33", **kwargs)  # type: ignore[arg-type]


def check(inputs: RejectionInputs, out: torch.Tensor, label: str) -> None:
    """``out`` agrees with the reference up to its near-ties; counts FLy's changes."""
    ref = rejection_sample_reference(*inputs.args(), **inputs.kwargs())
    ok, why = decision_margins_agree(ref, out)
    assert ok, why
    native = rejection_sample_reference(*inputs.args(), **replace(
        inputs, fly_window_size=None).kwargs())
    CHANGED[label] += int((native.tokens != ref.tokens).any(dim=1).sum())


# (case, window, threshold, top-k, config): windows 0, 1, 3 and above k; thresholds that
# defer every allowed rejection (0), some, none (10); greedy, random, mixed, seeded;
# split rows; every dtype; top-k above V.
SPLIT = {"BLOCK_V": 256, "SPLITS": 4, "num_warps": 2, "num_stages": 1}
FLY_CASES = [
    (Case(6, 5, 97, mode="greedy"), 1, 0.0, 3, None),
    (Case(5, 5, 97, mode="random"), 1, 0.5, 3, SMALL_TILE),
    (Case(4, 5, 300, dtype=torch.bfloat16, mode="mixed"), 0, 0.3, 3, SPLIT),
    (Case(4, 5, 300, dtype=torch.float16, draft_probs=False), 3, 0.0, 5, SPLIT),
    (Case(4, 4, 129, seeded=True, mode="random"), 2, 0.1, 3, SMALL_TILE),
    (Case(4, 4, 33, mode="mixed"), 1, 10.0, 3, None),
    (Case(4, 4, 33, mode="mixed"), 5, 0.0, 3, None),
    (Case(4, 4, 5, mode="mixed"), 1, 0.0, 8, None),
    (Case(3, 3, 1, mode="mixed"), 1, 0.0, 3, None),
]


@pytest.mark.parametrize(
    ("case", "window", "threshold", "top_k", "config"), FLY_CASES,
    ids=[f"{c}-W{w}-t{t}-top{k}-{'split' if g == SPLIT else 'tile'}"
         for c, w, t, k, g in FLY_CASES],
)
def test_fly_matches_reference(case: Case, window: int, threshold: float, top_k: int,
                               config: dict[str, int] | None) -> None:
    inputs = with_fly(build(case, seed=7), window, threshold, top_k)
    check(inputs, run(inputs, config), "cases that may defer" if threshold < 10 and
          window < case.max_k else "cases that never defer")


def test_fly_every_config_gives_identical_tokens() -> None:
    inputs = with_fly(build(Case(4, 4, 600, mode="mixed"), seed=3), 1, 0.2)
    expected = run(inputs, SMALL_TILE)
    check(inputs, expected, "cases that may defer")
    for block, splits in ((256, 4), (512, 2), (1024, 1)):
        config = {"BLOCK_V": block, "SPLITS": splits, "num_warps": 2, "num_stages": 1}
        assert torch.equal(run(inputs, config), expected), config


def test_fly_folded_is_applying_the_parameters_first() -> None:
    """Folded temperature, top-k and top-p: the tokens of FLy on the processed rows,
    bit for bit (the entropy reads the very floats the unfolded launch reads)."""
    case = Case(4, 5, 300, mode="mixed")
    inputs = with_fly(build(case, seed=1), 1, 0.05)
    generator = torch.Generator().manual_seed(11)
    temperature, top_k, top_p = draw_sampling_params(case.batch, case.vocab,
                                                     generator=generator)
    folded = replace(inputs, temperature=temperature.to(DEVICE), top_k=top_k.to(DEVICE),
                     top_p=top_p.to(DEVICE))
    out = run(folded)
    unfolded = replace(folded, target_logits=process_v1(folded), temperature=None,
                       top_k=None, top_p=None)
    assert torch.equal(out, run(unfolded))
    check(unfolded, out, "cases that may defer")


def _inputs(rows: list[list[float]], drafts: list[int], counts: list[int],
            greedy: list[bool], *, draft_probs: list[list[float]] | None = None,
            uniform: float = 0.5) -> RejectionInputs:
    n_rows, vocab = len(rows), len(rows[0])
    return on_device(RejectionInputs(
        draft_token_ids=torch.tensor(drafts, dtype=torch.int32),
        cu_num_draft_tokens=torch.tensor(counts).cumsum(0).to(torch.int32),
        target_logits=torch.tensor(rows, dtype=torch.float32),
        bonus_token_ids=torch.arange(len(counts), dtype=torch.int64) % vocab,
        max_spec_len=max(counts),
        draft_probs=None if draft_probs is None else torch.tensor(draft_probs),
        is_greedy=None if all(greedy) else torch.tensor(greedy),
        uniform_probs=None if all(greedy) else torch.full((n_rows,), uniform,
                                                          dtype=torch.float64),
        inv_q=None if all(greedy) else torch.ones(len(counts), vocab),
    ))


def test_what_never_defers() -> None:
    """Window 0 and threshold 0: every natively rejected draft defers, except a padded
    draft, a greedy draft at a ``-inf`` logit, a row without a softmax (a NaN or +inf
    logit), and a random draft of draft probability 0 or target probability 0."""
    inf, nan = float("inf"), float("nan")
    vocab = 6
    base = [0.0, 1.0, 2.0, 3.0, 0.5, -inf]  # argmax 3, token 5 at -inf
    rows = [base, base, base, [*base[:4], nan, -inf], [*base[:4], inf, -inf]]
    # Greedy drafts 1 (defers), -1 (padded), 5 (-inf logit), 2 (NaN row), 0 (+inf row);
    # one request per row, so that every row is reached.
    greedy = _inputs(rows, drafts=[1, -1, 5, 2, 0], counts=[1, 1, 1, 1, 1],
                     greedy=[True] * 5)
    out = run(replace(greedy, fly_window_size=0, fly_entropy_threshold=0.0))
    assert out[:, 0].tolist() == [1, 3, 3, 4, 4]  # deferred, then argmaxes (NaN/inf first)
    check(with_fly(greedy, 0, 0.0), out, "edge rows")
    # Random requests: a coin of 1 rejects every draft natively (p(d) < dp(d) = 1 or 1/V).
    dp = [[1.0 / vocab] * vocab for _ in rows]
    dp[1][2] = 0.0  # draft probability 0
    random_rows = [base, base, base, [*base[:4], nan, -inf], base]
    random = _inputs(random_rows, drafts=[1, 2, 5, 2, -1], counts=[1, 1, 1, 1, 1],
                     greedy=[False] * 5, draft_probs=dp, uniform=1.0)
    out = run(replace(random, fly_window_size=0, fly_entropy_threshold=0.0))
    assert out[0, 0].item() == 1  # deferred
    native = launcher_032(*random.args(), **random.kwargs())
    assert torch.equal(out[1:], native[1:])  # dp 0, p 0, no softmax, padded: native
    check(with_fly(random, 0, 0.0), out, "edge rows")


def test_deferral_needs_the_next_drafts_accepted() -> None:
    """Greedy, window 2: a rejected draft defers only if the next two drafts are the
    argmax, and only with two drafts after it."""
    rows = [[0.0, 1.0, 2.0, 3.0]] * 4
    inputs = _inputs(rows, drafts=[0, 3, 3, 0], counts=[4], greedy=[True])
    out = run(with_fly(inputs, 2, 0.0))
    # Row 0 defers (rows 1, 2 accepted); row 3 has no drafts after it: argmax 3, stop.
    assert out.tolist() == [[0, 3, 3, 3, -1]]
    inputs = _inputs(rows, drafts=[0, 3, 0, 3], counts=[4], greedy=[True])
    assert run(with_fly(inputs, 2, 0.0)).tolist() == [[3, -1, -1, -1, -1]]
    # A deferral reads the native decisions only: row 0 needs rows 1 and 2 accepted
    # natively; row 1's own deferral does not count.
    inputs = _inputs(rows, drafts=[0, 0, 3, 3], counts=[4], greedy=[True])
    assert run(with_fly(inputs, 1, 0.0)).tolist() == [[3, -1, -1, -1, -1]]
    assert run(with_fly(inputs, 1, 0.0), None).tolist() == run(
        with_fly(inputs, 1, 0.0), SMALL_TILE).tolist()


def test_the_threshold_decides() -> None:
    """A threshold just under a row's entropy defers it, one just over does not."""
    rows = [[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 5.0]]
    inputs = _inputs(rows, drafts=[1, 3], counts=[2], greedy=[True])  # argmaxes 0, 3
    entropy = float(fly_entropy(torch.softmax(torch.tensor(rows), dim=-1), 3)[0])
    assert run(with_fly(inputs, 1, entropy - 1e-3)).tolist() == [[1, 3, 0]]
    assert run(with_fly(inputs, 1, entropy + 1e-3)).tolist() == [[0, -1, -1]]


def test_without_a_window_both_releases_are_the_032_launcher() -> None:
    inputs = build(Case(5, 4, 300, mode="mixed"), seed=5)
    expected = launcher_032(*inputs.args(), **inputs.kwargs())
    for version in ("0.32", "0.33", None):
        out = rejection_sample(*inputs.args(), **inputs.kwargs(), vllm_version=version,
                               fly_entropy_threshold=0.5)  # no window: FLy off
        assert torch.equal(out, expected), version


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fly_window_size": 1, "fly_entropy_threshold": 0.5, "vllm_version": "0.32"},
         "FLy verification is vLLM 0.33's"),
        ({"vllm_version": "0.34"}, "vllm_version must be one of"),
        ({"fly_window_size": -1, "fly_entropy_threshold": 0.5}, "fly_window_size must be"),
        ({"fly_window_size": True, "fly_entropy_threshold": 0.5}, "fly_window_size must be"),
        ({"fly_window_size": 1}, "fly_entropy_threshold is required"),
        ({"fly_window_size": 1, "fly_entropy_threshold": float("nan")}, "must not be NaN"),
        ({"fly_window_size": 1, "fly_entropy_threshold": 0.5, "fly_entropy_top_k": 0},
         "fly_entropy_top_k must be"),
    ],
)
def test_bad_fly_arguments_name_themselves(kwargs: dict[str, object], message: str) -> None:
    inputs = build(Case(2, 2, 7, mode="mixed"), seed=0)
    kwargs = {"vllm_version": "0.33", **kwargs}
    with pytest.raises(ValueError, match=message):
        rejection_sample(*inputs.args(), **inputs.kwargs(), **kwargs)  # type: ignore[arg-type]


def test_family_launches_fly_inputs() -> None:
    inputs = with_fly(build(Case(4, 4, 97, mode="mixed"), seed=2), 1, 0.1)
    out = FAMILY.launch(inputs, SMALL_TILE)
    assert torch.equal(out, run(inputs, SMALL_TILE))
    assert FAMILY.same(FAMILY.reference(inputs), out)


def test_zz_fly_changed_tokens() -> None:
    """The cases that may defer did (so the comparisons can fail); the others did not."""
    if not CHANGED:
        pytest.skip("the FLy cases did not run in this session")
    assert CHANGED["cases that may defer"] > 0, dict(CHANGED)
    assert CHANGED["cases that never defer"] == 0, dict(CHANGED)
    assert CHANGED["edge rows"] > 0, dict(CHANGED)
