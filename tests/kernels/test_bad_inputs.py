"""Bad inputs to the verification launchers (issue 16, finding 11): token ids outside the
contract, and NaN or infinite logits and draft probabilities.

Ids: only ``-1`` pads; every other id must be in ``[0, V)``, else a ValueError names the
argument, the first bad index and the id (``validate=True``, the default; with
``validate=False`` the ids are trusted, and one outside ``[0, V)`` is read as padding,
never outside its row).

Non-finite values have a defined result, the same on every backend and config, and the
references' (:mod:`spectune.kernels.rejection.rejection_sample_ref`,
:mod:`spectune.kernels.rejection_mrv2.rejection_sample_mrv2_ref`):

* greedy: ``torch.argmax`` of the row, what vLLM's greedy verification runs (a NaN is the
  max: the first NaN; else the first max, +inf included);
* V1 random: a row without a softmax (a NaN or +inf logit, or only -inf: torch's softmax,
  vLLM's, is NaN everywhere) rejects its draft and recovers token 0; a NaN draft prob
  rejects a draft and leaves a residual of 0 (vLLM's ``tl.maximum(p - q, 0)`` on a GPU,
  where its output is defined: 0 for a NaN row with draft probs);
* MRV2 random: float64 ``torch.logsumexp`` semantics for the acceptance test, and the
  Gumbel-max argmax in ``torch.argmax``'s order (vLLM's MRV2 kernels leave NaN to the
  GPU's reduction order).

Every token is in ``[0, V)`` or the ``-1`` placeholder.

Folded (the sampling parameters applied inside the kernels: V1's ``temperature``,
``top_k``, ``top_p``, ``min_p``; MRV2's ``apply_sampling_params``), the tokens are those of
the parameters applied first (:func:`~spectune.kernels.rejection.unfolded_v1`,
:func:`~spectune.kernels.rejection_mrv2.unfolded_mrv2`), then the above: a
row keeps its kind through them (a NaN has the largest key, so no mask drops it; +inf
and only -inf stay), and a greedy row is not processed, its argmax the raw row's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from spectune.kernels import rejection_sample, rejection_sample_mrv2
from spectune.kernels.rejection import RejectionInputs, rejection_sample_reference, unfolded_v1
from spectune.kernels.rejection_mrv2 import (
    Mrv2Inputs,
    rejection_sample_mrv2_reference,
    unfolded_mrv2,
)
from tests.kernels.conftest import on_device
from tests.kernels.rejection.test_rejection import _call, _good
from tests.kernels.rejection_mrv2.test_rejection_mrv2 import _set, _valid_inputs
from tests.kernels.rejection_mrv2.test_rejection_mrv2 import on_device as mrv2_on_device
from tests.kernels.test_folded_verification import _TEMPERATURES, _cycle

pytestmark = [
    # numpy's warnings from the interpreter evaluating both sides of a tl.where,
    pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning"),
    # and from its tl.max (numpy's nanmax) over a tile of NaNs.
    pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning"),
]

NAN, INF = math.nan, math.inf
#: Vocabularies of one tile (7, 33, 129) and of three 256-tiles split in three (600).
VOCABS = [7, 33, 129, 600]
SPLIT = {"BLOCK_V": 256, "SPLITS": 4, "num_warps": 4, "num_stages": 2}
MRV2_SPLIT = {**SPLIT, "BLOCK_R": 256}
#: The folded launches' configs at 600: the pre-pass's threshold search in 256-tiles too.
FOLDED_SPLIT = {**SPLIT, "BLOCK_T": 256, "PIVOTS": 4}
FOLDED_MRV2_SPLIT = {**MRV2_SPLIT, "BLOCK_T": 256, "PIVOTS": 4}
#: Folded: one tile, and three split in three (the interpreter is slow).
FOLDED_VOCABS = [33, 600]


# --------------------------------------------------------------------------------------
# Token ids
# --------------------------------------------------------------------------------------


def test_v1_draft_id_below_minus_one_is_refused_not_padding() -> None:
    inputs = _good()
    drafts = inputs.draft_token_ids.clone()
    drafts[2] = -5
    with pytest.raises(ValueError, match=r"^draft_token_ids\[2\] = -5: .*\[0, 11\) or -1"):
        _call(inputs, draft_token_ids=drafts)
    drafts[2] = -1  # the one padding value
    _call(inputs, draft_token_ids=drafts)


@pytest.mark.parametrize("bad", [11, -1, -7], ids=["vocab", "minus-1", "negative"])
def test_v1_bonus_id_outside_the_vocabulary_is_refused(bad: int) -> None:
    inputs = _good()
    bonus = inputs.bonus_token_ids.clone()
    bonus[1] = bad
    with pytest.raises(ValueError, match=rf"^bonus_token_ids\[1\] = {bad}: .*\[0, 11\)$"):
        _call(inputs, bonus_token_ids=bonus)


def test_mrv2_bad_draft_id_is_named_with_its_index() -> None:
    inputs = _valid_inputs()
    for index, bad in ((1, -2), (4, 7)):
        with pytest.raises(ValueError, match=rf"^draft_sampled\[{index}\] = {bad}: "):
            rejection_sample_mrv2(*replace(inputs, draft_sampled=_set(
                inputs.draft_sampled, index, bad)).args())


def test_unvalidated_ids_outside_the_vocabulary_are_padding() -> None:
    """``validate=False`` (vLLM's path): no check, no sync; an id outside [0, V) acts as
    -1 and is never read past its row (a coin of 0 would accept anything read there)."""
    vocab = 7
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(3))
    dp = torch.full((3, vocab), 1.0 / vocab)
    base = on_device(RejectionInputs(
        draft_token_ids=torch.tensor([-1, 2, -1]), cu_num_draft_tokens=torch.tensor([1, 3]),
        target_logits=logits, bonus_token_ids=torch.tensor([1, 2]), max_spec_len=2,
        draft_probs=dp, is_greedy=torch.tensor([False, False]),
        uniform_probs=torch.zeros(3, dtype=torch.float64), inv_q=torch.ones(2, vocab),
    ))
    want = rejection_sample(*base.args(), **base.kwargs())
    for bad in (-5, vocab, vocab + 3):
        drafts = base.draft_token_ids.clone()
        drafts[[0, 2]] = bad
        inputs = replace(base, draft_token_ids=drafts)
        got = rejection_sample(*inputs.args(), **inputs.kwargs(), validate=False)
        assert got.tolist() == want.tolist(), bad

    mrv2 = _valid_inputs()  # drafts per request [2, 0, 2]: slots 1, 2, 5, 6 are drafts
    placeholders = torch.tensor([2, 6])
    mrv2 = replace(mrv2, draft_sampled=_set(_set(mrv2.draft_sampled, 2, -1), 6, -1))
    want2 = rejection_sample_mrv2(*mrv2.args())
    for bad in (-9, 7, 12):
        drafts = mrv2.draft_sampled.clone()
        drafts[placeholders] = bad
        got2 = rejection_sample_mrv2(*replace(mrv2, draft_sampled=drafts).args(), validate=False)
        assert [t.tolist() for t in got2] == [t.tolist() for t in want2], bad


# --------------------------------------------------------------------------------------
# Rows with NaN and infinities
# --------------------------------------------------------------------------------------


def _finite(vocab: int, gen: torch.Generator) -> list[float]:
    return (torch.randn(vocab, generator=gen) * 2).tolist()


def _with(values: dict[int, float]) -> Callable[[int, torch.Generator], list[float]]:
    """A finite row with ``values`` at positions (negative: from the end)."""
    def row(vocab: int, gen: torch.Generator) -> list[float]:
        out = _finite(vocab, gen)
        for i, v in values.items():
            out[i % vocab] = v
        return out
    return row


#: Target rows: name -> builder(vocab, generator). In the 600 vocabulary, +inf at 1 and a
#: NaN at -2 sit in different tiles and splits: the NaN must still win.
ROWS: dict[str, Callable[[int, torch.Generator], list[float]]] = {
    "finite": _finite,
    "all-nan": lambda v, g: [NAN] * v,
    "some-nan": _with({3: NAN, -1: NAN}),
    "pos-inf": _with({1: INF, -3: INF}),
    "all-neg-inf": lambda v, g: [-INF] * v,
    "some-neg-inf": _with({0: -INF, 2: -INF, -1: -INF}),
    "inf-then-nan": _with({1: INF, -2: NAN}),
}
#: Drafter rows (V1 probabilities, MRV2 logits), beside a finite target row.
DRAFTER_ROWS: dict[str, Callable[[int, torch.Generator], list[float]]] = {
    "finite": _finite,
    "some-nan": _with({2: NAN, -2: NAN}),
    "all-nan": lambda v, g: [NAN] * v,
    "pos-inf": _with({4: INF}),
    "neg-inf": _with({0: -INF, 5: -INF}),
}


def _cases(vocab: int) -> list[tuple[str, str, int]]:
    """(target kind, drafter kind, draft id) per request: every target kind with a finite
    drafter and drafts 0 and 5, every drafter kind beside a finite target."""
    cases = [(t, "finite", d) for t in ROWS for d in (0, 5 % vocab)]
    cases += [("finite", k, d) for k in DRAFTER_ROWS if k != "finite" for d in (2, 4)]
    return cases


def _in_range(tokens: torch.Tensor, vocab: int) -> bool:
    return bool(((tokens == -1) | ((tokens >= 0) & (tokens < vocab))).all())


def _v1_inputs(vocab: int, mode: str) -> RejectionInputs:
    """One request per case, one draft each (its row), bonus ``vocab - 1``."""
    gen = torch.Generator().manual_seed(vocab)
    cases = _cases(vocab)
    logits = torch.tensor([ROWS[t](vocab, gen) for t, _, _ in cases])
    dp = None
    if mode == "random-dp":
        # The drafter's probabilities: a softmax, then the kind's non-finite values.
        dp = torch.softmax(torch.randn(len(cases), vocab, generator=gen), dim=-1)
        for i, (_, kind, _) in enumerate(cases):
            special = torch.tensor(DRAFTER_ROWS[kind](vocab, gen))
            dp[i] = torch.where(torch.isfinite(special), dp[i], special)
    random = mode != "greedy"
    n = len(cases)
    return on_device(RejectionInputs(
        draft_token_ids=torch.tensor([d for _, _, d in cases]),
        cu_num_draft_tokens=torch.arange(1, n + 1),
        target_logits=logits,
        bonus_token_ids=torch.full((n,), vocab - 1),
        max_spec_len=1,
        draft_probs=dp,
        is_greedy=torch.zeros(n, dtype=torch.bool) if random else None,
        uniform_probs=torch.full((n,), 0.5, dtype=torch.float64) if random else None,
        inv_q=(1.0 / torch.empty(n, vocab).exponential_(generator=gen)) if random else None,
    ))


def _fold_params(count: int, vocab: int) -> dict[str, torch.Tensor]:
    """Parameters to fold for ``count`` requests (V1) or request states (MRV2): all of
    them on, alternately strong (top-k 1, top-p 0.5, min-p 0.3) and mild (top-k V // 3,
    top-p 0.9, min-p 0.02), so each target kind of :func:`_cases` (two requests) meets
    both; temperatures cycle through the folded tests' range, every third one 0 (greedy).
    """
    strong = torch.arange(count) % 2 == 0
    temperature = torch.tensor(_cycle(_TEMPERATURES, count, 0), dtype=torch.float32)
    temperature[torch.arange(count) % 3 == 2] = 0.0
    return {
        "temperature": temperature,
        "top_k": torch.where(strong, 1, max(1, vocab // 3)).to(torch.int32),
        "top_p": torch.where(strong, 0.5, 0.9).to(torch.float32),
        "min_p": torch.where(strong, 0.3, 0.02).to(torch.float32),
    }


def _assert_v1_defined(out: torch.Tensor, inputs: RejectionInputs) -> None:
    """``out`` (CPU) is what the contract defines for :func:`_v1_inputs`' ``inputs``
    (their parameters, if any, folded): in range; the PyTorch reference's tokens on the
    rows as processed (:func:`unfolded_v1`: the parameters applied first; without any,
    the rows as given); each greedy row's torch.argmax, of the row as given; and
    ``[0, -1]`` where a random row has no softmax or an all-NaN drafter row leaves a
    residual of 0."""
    vocab = inputs.target_logits.shape[1]
    assert _in_range(out, vocab), out.tolist()
    chain = unfolded_v1(inputs)
    ref = rejection_sample_reference(*chain.args(), **chain.kwargs())
    assert out.tolist() == ref.tokens.tolist()
    logits = inputs.target_logits.cpu()
    greedy = (torch.ones(len(out), dtype=torch.bool) if inputs.is_greedy is None
              else inputs.is_greedy.cpu())
    for i, (target, drafter, _) in enumerate(_cases(vocab)):
        if greedy[i]:
            # vLLM's greedy path is torch.argmax: NaN first.
            assert out[i, 0] == int(torch.argmax(logits[i])), (target, out[i].tolist())
        elif target != "finite" and target != "some-neg-inf":
            assert out[i].tolist() == [0, -1], (target, out[i].tolist())  # no softmax
        elif inputs.draft_probs is not None and drafter == "all-nan":
            assert out[i].tolist() == [0, -1], (drafter, out[i].tolist())  # residual 0


@pytest.mark.parametrize("mode", ["greedy", "random-dp", "random-nodp"])
@pytest.mark.parametrize("vocab", VOCABS)
def test_v1_non_finite_rows_give_the_defined_tokens(vocab: int, mode: str) -> None:
    inputs = _v1_inputs(vocab, mode)
    out = rejection_sample(*inputs.args(), **inputs.kwargs(),
                           config=SPLIT if vocab > 256 else None).cpu()
    _assert_v1_defined(out, inputs)


@pytest.mark.parametrize("mode", ["greedy", "random-dp", "random-nodp"])
@pytest.mark.parametrize("vocab", FOLDED_VOCABS)
def test_v1_folded_non_finite_rows_give_the_defined_tokens(vocab: int, mode: str) -> None:
    """Temperature, min-p, top-k and top-p folded: the tokens of applying them first.
    Random modes mark every third request greedy (temperature 0): the launch folds, its
    pre-pass skips those rows. Greedy mode (no ``is_greedy``) folds nothing."""
    inputs = _v1_inputs(vocab, mode)
    params = _fold_params(len(inputs.bonus_token_ids), vocab)
    if inputs.is_greedy is not None:
        params["is_greedy"] = params["temperature"] == 0
    inputs = on_device(replace(inputs, **params))
    out = rejection_sample(*inputs.args(), **inputs.kwargs(),
                           config=FOLDED_SPLIT if vocab > 256 else None).cpu()
    _assert_v1_defined(out, inputs)


def test_v1_token_of_a_nan_row_does_not_depend_on_the_config() -> None:
    inputs = _v1_inputs(600, "random-dp")
    base = rejection_sample(*inputs.args(), **inputs.kwargs())
    for splits in (1, 2, 4):
        out = rejection_sample(*inputs.args(), **inputs.kwargs(),
                               config={**SPLIT, "SPLITS": splits, "BLOCK_V": 256})
        assert torch.equal(out, base), splits


def _mrv2_inputs(vocab: int, mode: str, *, use_fp64: bool = False) -> Mrv2Inputs:
    """One request per case, k = 1: the draft row holds the case's target row, the bonus
    row a finite one. Four more requests put the special rows where a plain row samples:
    an all-NaN and a some-NaN bonus row after a draft that is always accepted (its
    probability about 1, the drafter's the same), and the same rows as the draft row of a
    placeholder draft."""
    gen = torch.Generator().manual_seed(1000 + vocab)
    cases = _cases(vocab)
    rows: list[list[float]] = []
    drafts: list[int] = []
    drafter: list[list[float]] = []
    for target, kind, draft in cases:
        rows += [ROWS[target](vocab, gen), _finite(vocab, gen)]
        drafts += [0, draft]  # draft_sampled[r + 1] is what row r verifies
        drafter.append(DRAFTER_ROWS[kind](vocab, gen))
    for special in ("all-nan", "some-nan"):
        sure = [0.0] * vocab
        sure[1] = 60.0
        rows += [sure, ROWS[special](vocab, gen)]  # draft 1 accepted: the bonus row samples
        rows += [ROWS[special](vocab, gen), _finite(vocab, gen)]  # a placeholder: row 0
        drafts += [0, 1, 0, -1]
        drafter += [sure, sure]
    n = len(drafts) // 2
    greedy = mode == "greedy"
    return mrv2_on_device(Mrv2Inputs(
        target_logits=torch.tensor(rows),
        draft_logits=torch.tensor(drafter)[:, None, :] if mode == "random-dl" else None,
        draft_sampled=torch.tensor(drafts),
        cu_num_logits=torch.arange(0, 2 * n + 1, 2),
        pos=torch.arange(2 * n) + 1000,
        idx_mapping=torch.arange(n),
        expanded_idx_mapping=torch.arange(n).repeat_interleave(2),
        expanded_local_pos=torch.tensor([0, 1] * n),
        temperature=torch.full((n,), 0.0 if greedy else 1.0),
        seed=torch.arange(n) * 7919 + 17,
        num_speculative_steps=1,
        use_fp64=use_fp64,
    ))


def _assert_mrv2_defined(got: tuple[torch.Tensor, torch.Tensor], inputs: Mrv2Inputs) -> None:
    """``got`` (``sampled``, ``num_sampled``) is what the contract defines for
    :func:`_mrv2_inputs`' ``inputs`` (folded if ``apply_sampling_params``): in range;
    the PyTorch reference's on the rows as processed (:func:`unfolded_mrv2`); the
    torch.argmax of each greedy request's first row, as given; the special rows' first
    NaN."""
    sampled, counts = (t.cpu() for t in got)
    vocab = inputs.target_logits.shape[1]
    assert _in_range(sampled, vocab), sampled.tolist()
    ref = rejection_sample_mrv2_reference(*unfolded_mrv2(inputs).args())
    assert counts.tolist() == ref.num_sampled.tolist()
    assert sampled.tolist() == ref.sampled.tolist()
    target = inputs.target_logits.cpu()
    greedy = inputs.temperature.cpu()[inputs.idx_mapping.cpu().long()] == 0
    n_cases = len(_cases(vocab))
    for i in range(n_cases + 4):
        if greedy[i]:
            assert sampled[i, 0] == int(torch.argmax(target[2 * i])), sampled[i].tolist()
    # The special bonus and placeholder rows sample their first NaN (torch.argmax).
    for i, row in zip(range(n_cases, n_cases + 4), (1, 0, 1, 0), strict=True):
        emitted = sampled[i, : int(counts[i])].tolist()
        special = target[2 * i + row]
        first_nan = int(torch.isnan(special).nonzero()[0])
        assert emitted[-1] == first_nan, (i, emitted)


@pytest.mark.parametrize("mode", ["greedy", "random-dl", "random-nodl"])
@pytest.mark.parametrize("vocab", VOCABS)
def test_mrv2_non_finite_rows_give_the_defined_tokens(vocab: int, mode: str) -> None:
    inputs = _mrv2_inputs(vocab, mode, use_fp64=vocab == 33)
    config = MRV2_SPLIT if vocab > 256 else None
    _assert_mrv2_defined(rejection_sample_mrv2(*inputs.args(), config=config), inputs)


@pytest.mark.parametrize(("vocab", "mode"), [
    (vocab, mode) for vocab in FOLDED_VOCABS for mode in ("greedy", "random-dl", "random-nodl")
    if (vocab, mode) != (600, "random-nodl")  # the slowest under the interpreter; 33 has it
])
def test_mrv2_folded_non_finite_rows_give_the_defined_tokens(vocab: int, mode: str) -> None:
    """``apply_sampling_params``: the tokens of applying the parameters first. Random
    modes make every third request state greedy (temperature 0, not processed); the
    special requests' sure draft sits in strong states (top-k 1), so it is accepted at
    any temperature."""
    inputs = _mrv2_inputs(vocab, mode, use_fp64=vocab == 33)
    params = _fold_params(len(inputs.temperature), vocab)
    if mode == "greedy":
        params["temperature"] = inputs.temperature
    inputs = mrv2_on_device(replace(inputs, apply_sampling_params=True, **params))
    config = FOLDED_MRV2_SPLIT if vocab > 256 else None
    got = rejection_sample_mrv2(*inputs.args(), **inputs.kwargs(), config=config)
    _assert_mrv2_defined(got, inputs)
