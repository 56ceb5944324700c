"""The promotion rule (spectune/promotion.py), shared by db merge and the tuner."""

from __future__ import annotations

import math

import pytest

from spectune.promotion import MIN_GAIN, Timing, is_significantly_faster


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
