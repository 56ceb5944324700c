"""What one evaluation of a configuration returns, and how a study records it."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FAILURE_KINDS", "Outcome", "Status", "TrialRecord"]

#: Reasons a configuration can fail. ``crash`` is also what the engine records for a
#: configuration whose worker process died evaluating it too many times.
FAILURE_KINDS = ("compile", "out_of_resources", "timeout", "runtime", "crash", "other")


class Status(str, enum.Enum):
    """How an evaluation ended (the values match ``spectune.tuning.trial``)."""

    OK = "ok"
    FAIL = "fail"
    INVALID = "invalid"


@dataclass(frozen=True)
class Outcome:
    """The result of evaluating one configuration.

    Build one with :meth:`ok`, :meth:`failed` or :meth:`invalid`.

    Attributes:
        status: ``OK`` (timed), ``FAIL`` (did not run) or ``INVALID`` (wrong result).
        time: The time to minimise, when ``OK``.
        failure: One of :data:`FAILURE_KINDS`, when ``FAIL``.
        message: Why it failed or was invalid.
        cost: Seconds this evaluation is charged against a time budget; ``None``
            charges the wall time the objective took (a replay charges recorded times).
        attrs: Extra JSON-serialisable values stored as user attributes of the trial.
    """

    status: Status
    time: float | None = None
    failure: str | None = None
    message: str = ""
    cost: float | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.status, Status):
            raise ValueError(f"status must be a Status, got {self.status!r}")
        if self.status is Status.OK:
            if not _positive_finite(self.time):
                raise ValueError(f"time must be a finite number > 0, got {self.time!r}")
        elif self.time is not None:
            raise ValueError(f"time must be None unless status is OK, got {self.time!r}")
        if self.status is Status.FAIL and self.failure not in FAILURE_KINDS:
            raise ValueError(f"failure must be one of {FAILURE_KINDS}, got {self.failure!r}")
        if self.status is not Status.FAIL and self.failure is not None:
            raise ValueError(f"failure must be None unless status is FAIL, got {self.failure!r}")
        if self.cost is not None and not (_finite(self.cost) and self.cost >= 0):
            raise ValueError(f"cost must be a finite number >= 0, got {self.cost!r}")

    @classmethod
    def ok(
        cls, time: float, *, cost: float | None = None, attrs: Mapping[str, Any] | None = None
    ) -> Outcome:
        """A timed, correct configuration (lower ``time`` is better)."""
        return cls(Status.OK, time=time, cost=cost, attrs=dict(attrs or {}))

    @classmethod
    def failed(
        cls,
        failure: str,
        message: str = "",
        *,
        cost: float | None = None,
        attrs: Mapping[str, Any] | None = None,
    ) -> Outcome:
        """A configuration that did not run: compile error, out of resources, time-out..."""
        return cls(
            Status.FAIL, failure=failure, message=message, cost=cost, attrs=dict(attrs or {})
        )

    @classmethod
    def invalid(
        cls, message: str = "", *, cost: float | None = None, attrs: Mapping[str, Any] | None = None
    ) -> Outcome:
        """A configuration that ran but gave a wrong result: recorded, never best."""
        return cls(Status.INVALID, message=message, cost=cost, attrs=dict(attrs or {}))


@dataclass(frozen=True)
class TrialRecord:
    """One charged evaluation of a study, as the engine recorded it.

    Attributes:
        number: The Optuna trial number.
        evaluation: 1-based position among the study's charged evaluations.
        config: The configuration.
        status: How it ended.
        time: Its time when ``OK``.
        failure: Failure kind when ``FAIL``.
        message: Why it failed or was invalid.
        cost: Seconds charged for it.
        warm_start: Whether it came from the warm-start list.
    """

    number: int
    evaluation: int
    config: dict[str, int]
    status: Status
    time: float | None
    failure: str | None
    message: str
    cost: float
    warm_start: bool


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _positive_finite(x: object) -> bool:
    return _finite(x) and x > 0  # type: ignore[operator]
