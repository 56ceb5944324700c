"""The search engine: one Optuna study, one configuration at a time, until a stop.

:class:`Search` opens (or resumes) a study over a search space and :meth:`Search.run`
evaluates configurations proposed by a strategy until a stop condition holds: a number
of charged evaluations, a time budget, patience, or an exhausted space. Several worker
processes can run the same study at once through a shared storage (a JournalStorage
file or an RDB URL); each then stops on the study-wide counts.

Guarantees:

* only valid configurations of the space are evaluated;
* no configuration is evaluated twice in a study (including across workers and resumes);
* failures and invalid results are recorded and never best;
* a trial left RUNNING by a killed worker is marked ``abandoned`` and its configuration
  retried; after ``max_retries`` deaths on the same configuration it is recorded as a
  ``crash`` failure instead;
* on a shared storage, a worker that would stop because the trials other workers are
  running fill the study (``max_evals``, an exhausted space) waits for them instead, so
  that a trial whose worker died is still recovered and retried, and the study ends
  complete.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage, InMemoryStorage
from optuna.trial import FrozenTrial, TrialState

from spectune.search._outcome import Outcome, Status, TrialRecord
from spectune.search._recording import (
    COST_KEY,
    FAILURE_KEY,
    MESSAGE_KEY,
    RETRY_KEY,
    STATUS_KEY,
    WARM_KEY,
    charged_status,
    config_of,
    to_record,
)
from spectune.search._sampler import EXHAUSTED_KEY, SpaceSampler, history_of
from spectune.search._space_index import SpaceIndex
from spectune.search._storage import (
    HEARTBEAT_KEY,
    OWNER_KEY,
    Heartbeat,
    StorageUnavailableError,
    is_abandoned,
    open_storage,
    running_trial,
    worker_identity,
)
from spectune.search._strategies import OptunaStrategy, make_strategy
from spectune.search._strategy import Strategy
from spectune.space import SearchSpace

__all__ = [
    "STOP_REASONS",
    "Objective",
    "Search",
    "SearchObserver",
    "SearchProgress",
    "SearchResult",
    "search",
]

_log = logging.getLogger(__name__)

#: Why :meth:`Search.run` returned.
STOP_REASONS = ("max_evals", "time_budget", "patience", "exhausted")

#: Evaluates one configuration.
Objective = Callable[[dict[str, int]], Outcome]

_SPACE_KEY = "spectune.space"
# Consecutive proposals that were not evaluations (duplicates) before giving up.
_MAX_IDLE_PROPOSALS = 50
# First wait (seconds) for other workers' running trials; it doubles while they run.
_FIRST_POLL_S = 0.1


@dataclass(frozen=True)
class _Started:
    """A trial just started by this worker.

    Attributes:
        trial_id: Its storage id.
        config: Its configuration.
        exhausted: Whether it was proposed with nothing left; ``None`` when it came
            through Optuna's ``ask`` (then only the storage knows).
        owned: Whether it was created with its owner and first heartbeat.
    """

    trial_id: int
    config: dict[str, int]
    exhausted: bool | None
    owned: bool


@dataclass(frozen=True)
class SearchProgress:
    """The state of a search after one evaluation, as observers see it.

    Attributes:
        record: The evaluation just recorded.
        evaluations: Charged evaluations in the study (all workers, all sessions).
        best: Best evaluation of the study so far.
        improved: Whether ``record`` is the new best.
        since_improvement: Evaluations since the best one.
        spent: Seconds charged in this run.
        max_evals: The run's evaluation limit.
        time_budget: The run's time budget in seconds.
    """

    record: TrialRecord
    evaluations: int
    best: TrialRecord | None
    improved: bool
    since_improvement: int
    spent: float
    max_evals: int | None
    time_budget: float | None


@dataclass(frozen=True)
class SearchResult:
    """What a run ended with.

    Attributes:
        study_name: The Optuna study.
        best: Best evaluation of the study (all workers), ``None`` if none succeeded.
        history: Every charged evaluation of the study, in trial order.
        new_evaluations: Evaluations charged by this run.
        stop_reason: One of :data:`STOP_REASONS`.
        spent: Seconds charged in this run.
    """

    study_name: str
    best: TrialRecord | None
    history: tuple[TrialRecord, ...]
    new_evaluations: int
    stop_reason: str
    spent: float

    @property
    def best_config(self) -> dict[str, int] | None:
        return None if self.best is None else dict(self.best.config)

    @property
    def best_time(self) -> float | None:
        return None if self.best is None else self.best.time


class SearchObserver:
    """Receives progress of :meth:`Search.run`; override what you need."""

    def on_start(self, search: Search, *, evaluations: int, max_evals: int | None) -> None:
        """The run starts; ``evaluations`` were already charged (resume, other workers)."""

    def on_trial(self, progress: SearchProgress) -> None:
        """One evaluation was recorded."""

    def on_stop(self, result: SearchResult) -> None:
        """The run stopped."""


class Search:
    """A search over ``space`` recorded in one Optuna study.

    Args:
        space: The search space (or its :class:`SpaceIndex`, to reuse an enumeration).
        storage: ``None`` (memory), a JournalStorage file path, an RDB URL or an Optuna
            storage. The same storage and ``study_name`` resume a study, and let
            several processes work on it at once (give each its own ``seed``).
        study_name: Name of the study in ``storage``.
        sampler: A strategy name (``auto``, ``tpe``, ``optuna-gp``, ``random``; see
            :data:`~spectune.search.STRATEGIES`), a :class:`~spectune.search.Strategy`,
            or any Optuna sampler (kept inside the space and away from seen
            configurations by resampling and repair).
        seed: Seed of the strategy.
        warm_start: Configurations evaluated first, in order (a kernel's default, the
            best configs of neighbouring problems). Configs outside the space, or already
            in the study, are skipped.
        stale_after: Seconds without heartbeat after which a RUNNING trial of another
            host counts as abandoned (a dead process on this host is seen at once).
        heartbeat_interval: Seconds between heartbeats of a running evaluation.
        max_retries: Times a configuration whose worker died is retried before it is
            recorded as a ``crash`` failure.
        user_attrs: Set as the study's user attributes (what the study tunes: kernel,
            problem, device...), shown by ``optuna-dashboard``; values must be JSON.

    Raises:
        ValueError: naming the argument, for an unknown sampler, an empty space, or an
            existing study over a different space.
    """

    def __init__(
        self,
        *,
        space: SearchSpace | SpaceIndex,
        storage: str | Path | BaseStorage | None = None,
        study_name: str = "spectune",
        sampler: str | Strategy | optuna.samplers.BaseSampler = "auto",
        seed: int | None = None,
        warm_start: Sequence[Mapping[str, int]] = (),
        stale_after: float = 600.0,
        heartbeat_interval: float = 30.0,
        max_retries: int = 2,
        user_attrs: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(space, SpaceIndex):
            self.index = space
        elif isinstance(space, SearchSpace):
            self.index = SpaceIndex(space)
        else:
            raise TypeError(f"space must be a SearchSpace, got {type(space).__name__}")
        if not isinstance(study_name, str) or not study_name:
            raise ValueError(f"study_name must be a non-empty string, got {study_name!r}")
        for name, value in (
            ("stale_after", stale_after),
            ("heartbeat_interval", heartbeat_interval),
        ):
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if not (isinstance(max_retries, int) and max_retries >= 0):
            raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
        if user_attrs is not None and not (
            isinstance(user_attrs, Mapping) and all(isinstance(k, str) for k in user_attrs)
        ):
            raise TypeError("user_attrs must be a mapping with string keys, or None")
        self.space = self.index.space
        self.study_name = study_name
        self.stale_after = float(stale_after)
        self.heartbeat_interval = float(heartbeat_interval)
        self.max_retries = max_retries
        self.strategy = _strategy(sampler, seed)
        self.sampler = SpaceSampler(self.index, self.strategy, seed=seed)
        self.storage = open_storage(storage)
        # Only a storage other processes can see needs owners, heartbeats and recovery.
        self._shared = not isinstance(self.storage, InMemoryStorage)
        self.study = optuna.create_study(
            storage=self.storage,
            study_name=study_name,
            direction="minimize",
            sampler=self.sampler,
            load_if_exists=True,
        )
        self._check_space()
        if user_attrs:
            self._set_user_attrs(user_attrs)
        self._enqueue(warm_start)

    # -- reading ----------------------------------------------------------------------

    def history(self) -> list[TrialRecord]:
        """Every charged evaluation of the study, in trial order."""
        return _history(self.study.get_trials(deepcopy=False))

    def best(self) -> TrialRecord | None:
        """The best evaluation so far, ``None`` when none succeeded."""
        return _best(self.history())

    # -- running ----------------------------------------------------------------------

    def run(
        self,
        objective: Objective,
        *,
        max_evals: int | None = None,
        time_budget: float | None = None,
        patience: int | None = None,
        observers: Sequence[SearchObserver] = (),
    ) -> SearchResult:
        """Evaluate proposals until a stop condition holds.

        Args:
            objective: Evaluates one config and returns an :class:`Outcome`. An
                exception it raises is recorded as an ``other`` failure.
            max_evals: Stop when the study holds this many charged evaluations.
            time_budget: Stop starting evaluations once this run has been charged this
                many seconds (evaluation costs plus the engine's own time).
            patience: Stop after this many evaluations without a new best.
            observers: Receive progress.

        Returns:
            The :class:`SearchResult`; stopping on an exhausted space is not an error.

        Raises:
            ValueError: naming the argument, for a non-positive limit.
        """
        if not callable(objective):
            raise TypeError("objective must be callable")
        _positive("max_evals", max_evals, integer=True)
        _positive("time_budget", time_budget, integer=False)
        _positive("patience", patience, integer=True)
        started = time.monotonic()
        charged_cost = 0.0  # costs charged beyond (or instead of) measured wall time
        new = 0
        idle = 0
        trials: list[FrozenTrial] | None = self._recover_abandoned()
        for obs in observers:
            obs.on_start(self, evaluations=len(_history(trials)), max_evals=max_evals)

        def spent() -> float:
            return time.monotonic() - started + charged_cost

        reason = "exhausted"
        poll = _FIRST_POLL_S
        while True:
            # The study as read now serves the stop checks and the next proposal.
            trials = self._recover_abandoned() if trials is None else trials
            history = _history(trials)
            running = sum(1 for t in trials if t.state == TrialState.RUNNING)
            stop = self._stop_reason(history, running, max_evals, patience, time_budget, spent())
            if stop is not None and running and self._shared and stop in ("max_evals", "exhausted"):
                # Only other workers' running trials fill the study: wait for them, since
                # one whose worker died is recovered and retried here (stale_after).
                stop = self._stop_reason(history, 0, max_evals, patience, time_budget, spent())
                if stop is None:
                    # Soon at first (they are usually about to finish), then seldom.
                    time.sleep(poll)
                    poll = min(2 * poll, self._max_poll)
                    trials = None
                    continue
            poll = _FIRST_POLL_S
            if stop is not None:
                reason = stop
                break

            started_trial = self._start_trial(trials)
            trials = None
            tid = started_trial.trial_id
            try:
                step = self._step(objective, started_trial, max_evals)
            except StorageUnavailableError:  # nothing can be written; recovered as abandoned
                raise
            except BaseException:  # interrupted: not evaluated; retried first on resume
                self._interrupted(tid)
                raise
            if isinstance(step, str):  # skipped, not charged
                if step == "exhausted":
                    reason = step
                    break
                if step == "max_evals":  # others' trials fill the study: stop or wait, above
                    continue
                idle += 1
                if idle >= _MAX_IDLE_PROPOSALS:
                    reason = "exhausted"
                    break
                continue
            idle = 0
            outcome, wall, number = step
            cost = wall if outcome.cost is None else outcome.cost
            charged_cost += cost - wall
            if not self._record(tid, outcome, cost):
                # Another worker took this trial for abandoned (no heartbeat for
                # stale_after) and has queued its config again: the retry is charged.
                _log.warning(
                    "trial %d was recovered as abandoned while it ran; its result is "
                    "dropped and its configuration retried", number
                )
                continue
            new += 1
            if observers:
                history = self.history()
                record = next(r for r in reversed(history) if r.number == number)
                best = _best(history)
                progress = SearchProgress(
                    record=record,
                    evaluations=len(history),
                    best=best,
                    improved=best is not None and best.number == record.number,
                    since_improvement=_since_improvement(history),
                    spent=spent(),
                    max_evals=max_evals,
                    time_budget=time_budget,
                )
                for obs in observers:
                    obs.on_trial(progress)

        history = self.history()
        result = SearchResult(
            study_name=self.study_name,
            best=_best(history),
            history=tuple(history),
            new_evaluations=new,
            stop_reason=reason,
            spent=spent(),
        )
        for obs in observers:
            obs.on_stop(result)
        return result

    # -- internals --------------------------------------------------------------------

    def _stop_reason(
        self,
        history: list[TrialRecord],
        running: int,
        max_evals: int | None,
        patience: int | None,
        time_budget: float | None,
        spent: float,
    ) -> str | None:
        if max_evals is not None and len(history) + running >= max_evals:
            return "max_evals"
        if patience is not None and _since_improvement(history) >= patience:
            return "patience"
        if time_budget is not None and spent >= time_budget:
            return "time_budget"
        seen = {tuple(r.config[n] for n in self.index.names) for r in history}
        if len(seen) + running >= len(self.index):
            return "exhausted"
        return None

    def _start_trial(self, trials: Sequence[FrozenTrial]) -> _Started:
        """Create the next trial, RUNNING, with its configuration.

        The configuration is proposed from ``trials`` (the study as just read) and the
        trial created with its parameters, owner and first heartbeat in one storage call:
        Optuna's ``ask`` would read the study again and write each parameter on its own,
        a dozen round trips to a database server per trial. A configuration enqueued in
        the study (a warm start, a retry) still goes through ``ask``, which hands each out
        to one worker only.
        """
        if any(t.state == TrialState.WAITING for t in trials):
            trial = self.study.ask(self.index.distributions)
            config = {n: int(trial.params[n]) for n in self.index.names}
            return _Started(trial._trial_id, config, exhausted=None, owned=False)
        template = running_trial()
        self.sampler.before_trial(self.study, template)
        config, exhausted = self.sampler.pick(
            self.study, template, history_of(trials, self.index)
        )
        template.params = dict(config)
        template.distributions = dict(self.index.distributions)
        if self._shared:
            template.system_attrs = {OWNER_KEY: worker_identity(), HEARTBEAT_KEY: time.time()}
        if exhausted:
            template.system_attrs[EXHAUSTED_KEY] = True
        tid = self.storage.create_new_trial(self.study._study_id, template)
        return _Started(tid, config, exhausted=exhausted, owned=True)

    def _admit(
        self, tid: int, config: dict[str, int], max_evals: int | None
    ) -> tuple[str | None, int]:
        """``None`` to evaluate trial ``tid``, else why it is skipped; and its number."""
        trials = self.study.get_trials(deepcopy=False)
        number = next(t.number for t in trials if t._trial_id == tid)
        if self.index.row(config) is None:  # enqueued by someone else, outside the space
            return "outside", number
        slots = 0
        for t in trials:
            if t.number == number:
                continue
            counts = t.state == TrialState.RUNNING or charged_status(t) is not None
            # Slots go in trial order. An enqueued trial (a retry, a warm start) holds its
            # number from when it was queued, so it is admitted after higher-numbered
            # trials: they must count it while it waits, or both take the last slot.
            if (counts or t.state == TrialState.WAITING) and t.number < number:
                slots += 1
            if counts and t.params and config_of(t) == config:
                return "duplicate", number
        if max_evals is not None and slots >= max_evals:
            return "surplus", number
        return None, number

    def _step(
        self, objective: Objective, started: _Started, max_evals: int | None
    ) -> tuple[Outcome, float, int] | str:
        """Evaluate a fresh trial: its outcome, wall time and number, or why it was
        skipped."""
        tid, config = started.trial_id, started.config
        if self._shared and not started.owned:
            try:
                self.storage.set_trial_system_attr(tid, OWNER_KEY, worker_identity())
            except UpdateFinishedTrialError:  # recovered meanwhile (a storage outage)
                return "recovered"
        verdict, number = self._admit(tid, config, max_evals)
        if verdict == "duplicate":
            # The sampler flags a proposal made with nothing left, which is always one of
            # the study's configs: looked up only then (a read per trial saved).
            exhausted = started.exhausted
            if exhausted is None:
                exhausted = bool(self.storage.get_trial(tid).system_attrs.get(EXHAUSTED_KEY))
            if exhausted:
                self._skip(tid, "exhausted")
                return "exhausted"
        if verdict is not None:
            self._skip(tid, verdict)
            return "max_evals" if verdict == "surplus" else verdict
        start = time.monotonic()
        try:
            if self._shared:
                with Heartbeat(
                    self.storage, tid, interval=self.heartbeat_interval,
                    beat_now=not started.owned,
                ):
                    outcome = objective(dict(config))
            else:
                outcome = objective(dict(config))
        except Exception as exc:  # the search goes on; the reason is recorded
            outcome = Outcome.failed("other", f"{type(exc).__name__}: {exc}"[:500])
        wall = time.monotonic() - start
        if not isinstance(outcome, Outcome):
            raise TypeError(f"objective must return an Outcome, got {type(outcome).__name__}")
        return outcome, wall, number

    def _interrupted(self, tid: int) -> None:
        """Mark a trial cut short in this process; its config is evaluated next time."""
        frozen = self.storage.get_trial(tid)
        if frozen.state != TrialState.RUNNING:
            return
        self._skip(tid, "interrupted")
        config = config_of(frozen)
        if len(config) == len(self.index.names) and self.index.row(config) is not None:
            self.study.enqueue_trial(config, user_attrs={RETRY_KEY: frozen.number})

    def _record(self, tid: int, outcome: Outcome, cost: float) -> bool:
        """Record an evaluation; ``False`` when its trial was finished by someone else."""
        attrs: dict[str, Any] = dict(outcome.attrs)
        attrs[STATUS_KEY] = outcome.status.value
        attrs[COST_KEY] = cost
        if outcome.status is Status.FAIL:
            attrs[FAILURE_KEY] = outcome.failure
        if outcome.message:
            attrs[MESSAGE_KEY] = outcome.message
        if outcome.status is Status.OK:
            state, values = TrialState.COMPLETE, [float(outcome.time)]  # type: ignore[arg-type]
        else:
            state, values = TrialState.FAIL, None
        # Written straight to the storage rather than through ``study.tell``, which reads
        # the trial twice more: a finished trial (recovered by another worker meanwhile)
        # refuses every write.
        try:
            for key, value in attrs.items():
                self.storage.set_trial_user_attr(tid, key, value)
            self.storage.set_trial_state_values(tid, state, values)
        except UpdateFinishedTrialError:
            return False
        frozen = self.storage.get_trial(tid)
        self.sampler.after_trial(self.study, frozen, state, values)
        # Another worker may have marked it abandoned between our writes.
        return charged_status(frozen) == outcome.status.value

    def _skip(self, tid: int, status: str) -> None:
        """End a trial that was not an evaluation. PRUNED, not FAIL: dashboards and
        ``trials_dataframe()`` count FAIL trials as failed evaluations."""
        try:
            self.storage.set_trial_user_attr(tid, STATUS_KEY, status)
            self.storage.set_trial_state_values(tid, TrialState.PRUNED)
        except UpdateFinishedTrialError:
            return

    def _recover_abandoned(self) -> list[FrozenTrial]:
        """Recover the trials of dead workers; the study's trials after that."""
        trials = self.study.get_trials(deepcopy=False)
        if not self._shared:
            return trials
        now = time.time()
        recovered = False
        for t in trials:
            if t.state != TrialState.RUNNING or not is_abandoned(
                t, stale_after=self.stale_after, now=now
            ):
                continue
            config = config_of(t)
            deaths = 1 + sum(
                1
                for o in trials
                if o.user_attrs.get(STATUS_KEY) == "abandoned"
                and o.state == TrialState.FAIL
                and o.params
                and config_of(o) == config
            )
            crashed = bool(config) and deaths > self.max_retries
            recovered = True  # the study changed: read it again below
            try:
                if crashed:
                    self.storage.set_trial_user_attr(t._trial_id, STATUS_KEY, "fail")
                    self.storage.set_trial_user_attr(t._trial_id, FAILURE_KEY, "crash")
                    self.storage.set_trial_user_attr(
                        t._trial_id, MESSAGE_KEY, f"worker died {deaths} times evaluating it"
                    )
                    self.storage.set_trial_user_attr(t._trial_id, COST_KEY, 0.0)
                else:
                    self.storage.set_trial_user_attr(t._trial_id, STATUS_KEY, "abandoned")
                if not self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL):
                    continue
            except UpdateFinishedTrialError:
                continue  # another worker recovered it
            _log.warning("trial %d was abandoned by a dead worker", t.number)
            if config and not crashed and self.index.row(config) is not None:
                self.study.enqueue_trial(config, user_attrs={RETRY_KEY: t.number})
        return self.study.get_trials(deepcopy=False) if recovered else trials

    def _set_user_attrs(self, user_attrs: Mapping[str, Any]) -> None:
        """Set the study's user attributes that differ (every worker of a study sets
        the same ones: only the first writes)."""
        held = self.study.user_attrs
        for key, value in user_attrs.items():
            if key not in held or held[key] != value:
                self.study.set_user_attr(key, value)

    @property
    def _max_poll(self) -> float:
        """Most seconds between looks at the study while waiting for other workers."""
        return min(2.0, self.heartbeat_interval)

    def _check_space(self) -> None:
        signature = [[n, list(v)] for n, v in zip(self.index.names, self.index.values, strict=True)]
        study_id = self.storage.get_study_id_from_name(self.study_name)
        stored = self.storage.get_study_system_attrs(study_id).get(_SPACE_KEY)
        if stored is None:
            self.storage.set_study_system_attr(study_id, _SPACE_KEY, signature)
        elif stored != signature:
            raise ValueError(
                f"study {self.study_name!r} was created over a different space: {stored}"
            )

    def _enqueue(self, warm_start: Sequence[Mapping[str, int]]) -> None:
        if isinstance(warm_start, Mapping) or not isinstance(warm_start, Sequence):
            raise TypeError("warm_start must be a sequence of config mappings")
        trials = self.study.get_trials(deepcopy=False)
        present = set()
        for t in trials:
            params = t.system_attrs.get("fixed_params", t.params)
            present.add(tuple(sorted(params.items())))
        for config in warm_start:
            if not isinstance(config, Mapping) or self.index.row(config) is None:
                _log.warning("warm-start config %r is not in the space; skipped", config)
                continue
            plain = {n: int(config[n]) for n in self.index.names}
            key = tuple(sorted(plain.items()))
            if key in present:
                continue
            present.add(key)
            self.study.enqueue_trial(plain, user_attrs={WARM_KEY: True})


def search(
    objective: Objective,
    *,
    space: SearchSpace | SpaceIndex,
    max_evals: int | None = None,
    time_budget: float | None = None,
    patience: int | None = None,
    warm_start: Sequence[Mapping[str, int]] = (),
    sampler: str | Strategy | optuna.samplers.BaseSampler = "auto",
    seed: int | None = None,
    storage: str | Path | BaseStorage | None = None,
    study_name: str = "spectune",
    observers: Sequence[SearchObserver] = (),
    user_attrs: Mapping[str, Any] | None = None,
) -> SearchResult:
    """Open (or resume) a :class:`Search` and run it; see there for the arguments."""
    engine = Search(
        space=space,
        storage=storage,
        study_name=study_name,
        sampler=sampler,
        seed=seed,
        warm_start=warm_start,
        user_attrs=user_attrs,
    )
    return engine.run(
        objective,
        max_evals=max_evals,
        time_budget=time_budget,
        patience=patience,
        observers=observers,
    )


def _strategy(sampler: object, seed: int | None) -> Strategy:
    if isinstance(sampler, Strategy):
        return sampler
    if isinstance(sampler, optuna.samplers.BaseSampler):
        return OptunaStrategy(sampler, name=type(sampler).__name__)
    if isinstance(sampler, str):
        return make_strategy(sampler, seed=seed)
    raise TypeError(
        f"sampler must be a name, a Strategy or an optuna sampler, got {type(sampler).__name__}"
    )


def _history(trials: Sequence[FrozenTrial]) -> list[TrialRecord]:
    charged = sorted((t for t in trials if charged_status(t) is not None), key=lambda t: t.number)
    return [to_record(t, i + 1) for i, t in enumerate(charged)]


def succeeded(history: Sequence[TrialRecord]) -> list[TrialRecord]:
    """The evaluations of ``history`` that succeeded with a time, in its order."""
    return [r for r in history if r.status is Status.OK and r.time is not None]


def time_order(record: TrialRecord) -> tuple[float, int]:
    """Sort key of successes: faster first, ties to the earlier trial."""
    assert record.time is not None
    return record.time, record.number


def _best(history: Sequence[TrialRecord]) -> TrialRecord | None:
    ok = succeeded(history)
    return min(ok, key=time_order) if ok else None


def _since_improvement(history: Sequence[TrialRecord]) -> int:
    best = _best(history)
    if best is None:
        return len(history)
    return len(history) - best.evaluation


def _positive(name: str, value: object, *, integer: bool) -> None:
    if value is None:
        return
    if integer:
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    else:
        ok = (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value > 0
        )
    if not ok:
        kind = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{name} must be {kind} or None, got {value!r}")
