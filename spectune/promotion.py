"""The tuner's promotion rule: when a newly measured config replaces the incumbent.

Pure Python, shared by ``spectune.db`` (merging databases) and the tuner (promoting a
study's best config), so both decide conflicts the same way.

A candidate replaces the incumbent only when it is faster by a margin that noise
cannot explain: its median is at least ``min_gain`` (3%) lower *and* the two
p20–p80 ranges do not overlap (the candidate's p80 is below the incumbent's p20).

When the tuner decides (rather than a merge, which weighs timings already taken), the
two are measured side by side in one run: :func:`decide_side_by_side` times them in
alternating order, round after round, until the rule decides or :data:`MAX_ROUNDS` is
reached (the incumbent then stays).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_ROUNDS",
    "MIN_GAIN",
    "MIN_ROUNDS",
    "SideBySide",
    "Timing",
    "decide_side_by_side",
    "is_significantly_faster",
]

#: Least relative drop of the median for a candidate to replace the incumbent.
MIN_GAIN = 0.03
#: Fewest rounds of a side-by-side decision: one in each order (incumbent first, then
#: candidate first), so that a drift in time (warm-up, clocks, a neighbour's load)
#: favours neither config.
MIN_ROUNDS = 2
#: Most rounds of a side-by-side decision. A candidate whose median is lower by the
#: margin but whose range still overlaps the incumbent's after these many rounds is not
#: promoted: the incumbent stays.
MAX_ROUNDS = 6


@dataclass(frozen=True)
class Timing:
    """Percentiles of repeated measurements of one config, in microseconds.

    Attributes:
        p20: 20th percentile.
        p50: Median.
        p80: 80th percentile.
    """

    p20: float
    p50: float
    p80: float

    def __post_init__(self) -> None:
        for name in ("p20", "p50", "p80"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"Timing.{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"Timing.{name} must be finite and positive, got {value!r}")
        if not self.p20 <= self.p50 <= self.p80:
            raise ValueError(
                f"Timing must satisfy p20 <= p50 <= p80, got {self.p20}, {self.p50}, {self.p80}"
            )


def is_significantly_faster(
    candidate: Timing, incumbent: Timing, *, min_gain: float = MIN_GAIN
) -> bool:
    """Whether ``candidate`` should replace ``incumbent``.

    Args:
        candidate: Timing of the newly measured config.
        incumbent: Timing of the config in place.
        min_gain: Least relative drop of the median, in ``[0, 1)``.

    Returns:
        True when the candidate's p50 is at least ``min_gain`` lower than the
        incumbent's and the candidate's p80 is below the incumbent's p20.
    """
    if not isinstance(candidate, Timing):
        raise TypeError(f"candidate must be a Timing, got {type(candidate).__name__}")
    if not isinstance(incumbent, Timing):
        raise TypeError(f"incumbent must be a Timing, got {type(incumbent).__name__}")
    _check_min_gain(min_gain)
    return _enough_gain(candidate, incumbent, min_gain) and candidate.p80 < incumbent.p20


def _check_min_gain(min_gain: object) -> None:
    if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)):
        raise TypeError(f"min_gain must be a number, got {min_gain!r}")
    if not 0 <= min_gain < 1:
        raise ValueError(f"min_gain must be in [0, 1), got {min_gain!r}")


def _enough_gain(candidate: Timing, incumbent: Timing, min_gain: float) -> bool:
    """Whether the candidate's median is at least ``min_gain`` below the incumbent's."""
    # Compare the relative gain rather than p50 against p50 * (1 - min_gain): the latter
    # rounds (100 * 0.97 != 97.0) and would reject a gain of exactly min_gain.
    gain = (incumbent.p50 - candidate.p50) / incumbent.p50
    return gain >= min_gain - 1e-12


@dataclass(frozen=True)
class SideBySide:
    """What a side-by-side decision measured and decided.

    Attributes:
        faster: Whether the candidate replaces the incumbent.
        decided: Whether the rule decided; ``False`` when :data:`MAX_ROUNDS` (or the
            given limit) was reached first, in which case ``faster`` is ``False``.
        candidate: The candidate's timing over all rounds (each percentile the median of
            the rounds').
        incumbent: The incumbent's timing, likewise.
        rounds: Rounds measured.
    """

    faster: bool
    decided: bool
    candidate: Timing
    incumbent: Timing
    rounds: int


def decide_side_by_side(
    measure_candidate: Callable[[], Timing],
    measure_incumbent: Callable[[], Timing],
    *,
    min_gain: float = MIN_GAIN,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = MAX_ROUNDS,
) -> SideBySide:
    """Measure a candidate and the incumbent side by side until the rule decides.

    Each round times both, in alternating order (incumbent first in even rounds,
    candidate first in odd ones). After each round from ``min_rounds`` on, the rule
    (:func:`is_significantly_faster`) is applied to the timings over the rounds so far,
    each percentile the median of the rounds':

    - it holds: the candidate is faster (decided);
    - the candidate's median is less than ``min_gain`` below the incumbent's: no spread
      can make it faster, it is not (decided);
    - otherwise (the medians differ by the margin, the ranges overlap) another round is
      measured, up to ``max_rounds``; then the candidate is not faster (undecided).

    Args:
        measure_candidate: Times the candidate once (e.g. a timer over its launches).
        measure_incumbent: Times the incumbent once.
        min_gain: Least relative drop of the median, in ``[0, 1)``.
        min_rounds: Rounds measured before the rule is applied (at least 1).
        max_rounds: Most rounds measured (at least ``min_rounds``).

    Returns:
        The decision and the timings it was taken on.
    """
    if not callable(measure_candidate) or not callable(measure_incumbent):
        raise TypeError("measure_candidate and measure_incumbent must be callable")
    _check_min_gain(min_gain)
    for name, value, low in (("min_rounds", min_rounds, 1), ("max_rounds", max_rounds, min_rounds)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    candidates: list[Timing] = []
    incumbents: list[Timing] = []
    for index in range(max_rounds):
        if index % 2 == 0:
            incumbents.append(_timing(measure_incumbent, "measure_incumbent"))
            candidates.append(_timing(measure_candidate, "measure_candidate"))
        else:
            candidates.append(_timing(measure_candidate, "measure_candidate"))
            incumbents.append(_timing(measure_incumbent, "measure_incumbent"))
        candidate, incumbent = _pooled(candidates), _pooled(incumbents)
        if index + 1 < min_rounds:
            continue
        if is_significantly_faster(candidate, incumbent, min_gain=min_gain):
            return SideBySide(faster=True, decided=True, candidate=candidate,
                              incumbent=incumbent, rounds=index + 1)
        if not _enough_gain(candidate, incumbent, min_gain):
            return SideBySide(faster=False, decided=True, candidate=candidate,
                              incumbent=incumbent, rounds=index + 1)
    return SideBySide(faster=False, decided=False, candidate=candidate, incumbent=incumbent,
                      rounds=max_rounds)


def _timing(measure: Callable[[], Timing], name: str) -> Timing:
    timing = measure()
    if not isinstance(timing, Timing):
        raise TypeError(f"{name} must return a Timing, got {type(timing).__name__}")
    return timing


def _pooled(rounds: Sequence[Timing]) -> Timing:
    """Each percentile's median over ``rounds``. Medians keep the order of the
    percentiles (every round has p20 <= p50 <= p80), so the result is a Timing."""
    return Timing(
        p20=statistics.median(t.p20 for t in rounds),
        p50=statistics.median(t.p50 for t in rounds),
        p80=statistics.median(t.p80 for t in rounds),
    )
