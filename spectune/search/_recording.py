"""How an evaluation is written into an Optuna trial, and read back.

* ``OK``: state COMPLETE, value = time.
* ``FAIL`` / ``INVALID``: state FAIL (never Optuna's best), with the reason in user
  attributes.
* Trials that were not evaluations are not charged: state PRUNED (never counted as
  failures by Optuna's dashboard or ``trials_dataframe()``) with a ``spectune.status``
  of ``duplicate`` (config already evaluated or running), ``outside`` (enqueued config
  not in the space), ``interrupted`` (stopped by an exception such as
  KeyboardInterrupt), ``surplus`` (beyond ``max_evals``) or ``exhausted`` (nothing left
  to propose); or state FAIL with ``abandoned`` (its worker died: a failure, retried).
  Studies written before skips were PRUNED hold them as FAIL: read alike.

Every trial carries ``spectune.status``; failed and invalid ones also
``spectune.failure`` / ``spectune.message``; charged ones ``spectune.cost``.
"""

from __future__ import annotations

from typing import Any

from optuna.trial import FrozenTrial, TrialState

from spectune.search._outcome import Status, TrialRecord

__all__ = [
    "COST_KEY",
    "FAILURE_KEY",
    "MESSAGE_KEY",
    "RETRY_KEY",
    "STATUS_KEY",
    "WARM_KEY",
    "charged_status",
    "config_of",
    "to_record",
]

STATUS_KEY = "spectune.status"
FAILURE_KEY = "spectune.failure"
MESSAGE_KEY = "spectune.message"
COST_KEY = "spectune.cost"
WARM_KEY = "spectune.warm_start"
RETRY_KEY = "spectune.retry_of"

#: Statuses of trials that were not evaluations.
NOT_CHARGED = ("duplicate", "outside", "abandoned", "interrupted", "surplus", "exhausted")


def charged_status(trial: FrozenTrial) -> str | None:
    """``ok``, ``fail`` or ``invalid`` for a charged evaluation, else ``None``."""
    status = trial.user_attrs.get(STATUS_KEY)
    if trial.state == TrialState.COMPLETE:
        return "ok" if status in (None, "ok") else None
    if trial.state == TrialState.FAIL and status in ("fail", "invalid"):
        return str(status)
    return None


def config_of(trial: FrozenTrial) -> dict[str, int]:
    """The configuration a trial evaluated."""
    return {k: int(v) for k, v in trial.params.items()}


def to_record(trial: FrozenTrial, evaluation: int) -> TrialRecord:
    """The :class:`TrialRecord` of a charged trial."""
    status = Status(charged_status(trial))
    attrs: dict[str, Any] = trial.user_attrs
    cost = attrs.get(COST_KEY)
    return TrialRecord(
        number=trial.number,
        evaluation=evaluation,
        config=config_of(trial),
        status=status,
        time=float(trial.value) if status is Status.OK and trial.value is not None else None,
        failure=attrs.get(FAILURE_KEY) if status is Status.FAIL else None,
        message=str(attrs.get(MESSAGE_KEY, "")),
        cost=float(cost) if isinstance(cost, (int, float)) else 0.0,
        warm_start=bool(attrs.get(WARM_KEY, False)),
    )
