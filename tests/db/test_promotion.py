"""The promotion rule (spectune/promotion.py), shared by db merge and the tuner, and the
tuner's side-by-side decision under it."""

from __future__ import annotations

import math

import pytest

from spectune.promotion import (
    MAX_ROUNDS,
    MIN_GAIN,
    MIN_ROUNDS,
    SideBySide,
    Timing,
    decide_side_by_side,
    is_significantly_faster,
)


def timing(p50: float, spread: float = 1.0) -> Timing:
    return Timing(p50 - spread, p50, p50 + spread)


def test_min_gain_is_three_percent() -> None:
    assert MIN_GAIN == 0.03


@pytest.mark.parametrize(
    ("candidate", "incumbent", "expected"),
    [
        # 3% lower median exactly, ranges apart: promoted.
        (Timing(96.0, 97.0, 98.0), Timing(99.0, 100.0, 101.0), True),
        # 2.9% lower median, ranges apart: not enough gain.
        (Timing(96.0, 97.1, 97.5), Timing(99.0, 100.0, 101.0), False),
        # 10% lower median but candidate p80 == incumbent p20: ranges touch.
        (Timing(80.0, 90.0, 95.0), Timing(95.0, 100.0, 105.0), False),
        # ... and just below it: promoted.
        (Timing(80.0, 90.0, 94.999), Timing(95.0, 100.0, 105.0), True),
        # 50% faster but a noisy candidate whose p80 reaches into the incumbent's range.
        (Timing(10.0, 50.0, 120.0), Timing(99.0, 100.0, 101.0), False),
        # Slower candidate.
        (timing(110.0), timing(100.0), False),
        # Identical timings.
        (timing(100.0), timing(100.0), False),
    ],
)
def test_rule(candidate: Timing, incumbent: Timing, expected: bool) -> None:
    assert is_significantly_faster(candidate, incumbent) is expected


def test_min_gain_argument_changes_the_threshold() -> None:
    candidate, incumbent = Timing(89.0, 90.0, 91.0), Timing(99.0, 100.0, 101.0)
    assert is_significantly_faster(candidate, incumbent, min_gain=0.10)
    assert not is_significantly_faster(candidate, incumbent, min_gain=0.11)
    assert is_significantly_faster(candidate, incumbent, min_gain=0.0)


def test_rule_is_not_symmetric() -> None:
    fast, slow = timing(50.0), timing(100.0)
    assert is_significantly_faster(fast, slow)
    assert not is_significantly_faster(slow, fast)


@pytest.mark.parametrize(
    "values",
    [(2.0, 1.0, 3.0), (1.0, 3.0, 2.0), (0.0, 1.0, 2.0), (-1.0, 1.0, 2.0), (1.0, math.nan, 2.0),
     (1.0, 2.0, math.inf)],
)  # fmt: skip
def test_timing_rejects_unordered_or_non_positive(values: tuple[float, float, float]) -> None:
    with pytest.raises(ValueError, match="Timing"):
        Timing(*values)


def test_timing_rejects_non_numbers() -> None:
    with pytest.raises(TypeError, match="p50"):
        Timing(1.0, "2", 3.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="p20"):
        Timing(True, 2.0, 3.0)


@pytest.mark.parametrize("bad", [-0.01, 1.0, 2.0])
def test_min_gain_out_of_range(bad: float) -> None:
    with pytest.raises(ValueError, match="min_gain"):
        is_significantly_faster(timing(50.0), timing(100.0), min_gain=bad)


def test_arguments_must_be_timings() -> None:
    with pytest.raises(TypeError, match="candidate"):
        is_significantly_faster((1, 2, 3), timing(100.0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="incumbent"):
        is_significantly_faster(timing(100.0), 5.0)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# Side by side: the tuner's decision, measured in one run until the rule decides
# --------------------------------------------------------------------------------------


class Scripted:
    """Timings handed out in turn (a measurement's outcome is the decision's input), and
    the order the two configs were measured in."""

    def __init__(self, order: list[str], name: str, timings: list[Timing]) -> None:
        self.order, self.name, self.timings = order, name, list(timings)

    def __call__(self) -> Timing:
        self.order.append(self.name)
        return self.timings.pop(0)


def scripted(candidate: list[Timing], incumbent: list[Timing]) -> tuple[Scripted, Scripted]:
    order: list[str] = []
    return Scripted(order, "candidate", candidate), Scripted(order, "incumbent", incumbent)


def test_limits_live_with_the_rule() -> None:
    assert 2 <= MIN_ROUNDS <= MAX_ROUNDS


def test_side_by_side_alternates_and_decides_faster() -> None:
    cand, inc = scripted([timing(50.0)] * MAX_ROUNDS, [timing(100.0)] * MAX_ROUNDS)
    decision = decide_side_by_side(cand, inc)
    assert decision == SideBySide(faster=True, decided=True, candidate=timing(50.0),
                                  incumbent=timing(100.0), rounds=MIN_ROUNDS)
    # One round in each order: a drift in time favours neither.
    assert cand.order == ["incumbent", "candidate", "candidate", "incumbent"]


def test_side_by_side_decides_not_faster_on_close_medians() -> None:
    cand, inc = scripted([timing(99.0, 0.1)] * MAX_ROUNDS, [timing(100.0, 0.1)] * MAX_ROUNDS)
    decision = decide_side_by_side(cand, inc)
    assert (decision.faster, decision.decided, decision.rounds) == (False, True, MIN_ROUNDS)


def test_side_by_side_measures_again_while_noise_could_explain_the_gain() -> None:
    """A 6% lower median whose range overlaps the incumbent's (the 1.06x "not faster" of
    one run that became "inserted" at 1.21x on the next) is neither: more rounds are
    measured; the incumbent stays when the limit comes first."""
    noisy = Timing(80.0, 94.0, 99.0)
    cand, inc = scripted([noisy] * MAX_ROUNDS, [timing(100.0, 5.0)] * MAX_ROUNDS)
    decision = decide_side_by_side(cand, inc)
    assert (decision.faster, decision.decided, decision.rounds) == (False, False, MAX_ROUNDS)
    assert len(cand.order) == 2 * MAX_ROUNDS


def test_side_by_side_decides_once_the_rounds_agree() -> None:
    """One noisy round does not decide: the rule is applied to each percentile's median
    over the rounds, and decides once that is clear."""
    clean, noisy = Timing(80.0, 82.0, 84.0), Timing(60.0, 82.0, 130.0)
    cand, inc = scripted([noisy, noisy, clean, clean, clean, clean], [timing(100.0)] * 6)
    decision = decide_side_by_side(cand, inc)
    # Two noisy rounds of five: the median p80 is a clean round's.
    assert (decision.faster, decision.decided, decision.rounds) == (True, True, 5)
    assert decision.candidate == Timing(80.0, 82.0, 84.0)


def test_side_by_side_of_a_config_with_itself_never_promotes() -> None:
    same = [Timing(90.0, 100.0, 110.0), Timing(80.0, 91.0, 120.0), Timing(95.0, 109.0, 111.0)]
    cand, inc = scripted(same * 2, same * 2)
    assert not decide_side_by_side(cand, inc, max_rounds=6).faster


def test_side_by_side_argument_checks() -> None:
    def measure() -> Timing:
        return timing(100.0)

    with pytest.raises(TypeError, match="callable"):
        decide_side_by_side(5.0, measure)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_rounds"):
        decide_side_by_side(measure, measure, min_rounds=3, max_rounds=2)
    with pytest.raises(ValueError, match="min_rounds"):
        decide_side_by_side(measure, measure, min_rounds=0)
    with pytest.raises(ValueError, match="min_gain"):
        decide_side_by_side(measure, measure, min_gain=1.0)
    with pytest.raises(TypeError, match="measure_incumbent must return a Timing"):
        decide_side_by_side(measure, lambda: 5.0)  # type: ignore[arg-type, return-value]
