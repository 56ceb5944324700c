"""The tuner's promotion rule: when a newly measured config replaces the incumbent.

Pure Python, shared by ``spectune.db`` (merging databases) and the tuner (promoting a
study's best config), so both decide conflicts the same way.

A candidate replaces the incumbent only when it is faster by a margin that noise
cannot explain: its median is at least ``min_gain`` (3%) lower *and* the two
p20–p80 ranges do not overlap (the candidate's p80 is below the incumbent's p20).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MIN_GAIN", "Timing", "is_significantly_faster"]

#: Least relative drop of the median for a candidate to replace the incumbent.
MIN_GAIN = 0.03


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
    if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)):
        raise TypeError(f"min_gain must be a number, got {min_gain!r}")
    if not 0 <= min_gain < 1:
        raise ValueError(f"min_gain must be in [0, 1), got {min_gain!r}")
    # Compare the relative gain rather than p50 against p50 * (1 - min_gain): the latter
    # rounds (100 * 0.97 != 97.0) and would reject a gain of exactly min_gain.
    gain = (incumbent.p50 - candidate.p50) / incumbent.p50
    return gain >= min_gain - 1e-12 and candidate.p80 < incumbent.p20
