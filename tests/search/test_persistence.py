"""Resume from a persistent study, a worker killed mid-study, two workers on one study."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from spectune.search import Outcome, Search, Status, search

from .spaces import bowl, bowl_objective, grid_space

optuna.logging.set_verbosity(optuna.logging.ERROR)
ROOT = Path(__file__).resolve().parents[2]


def _worker(
    storage: Path, log: Path, *, seed: int, max_evals: int, sleep: float
) -> subprocess.Popen:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.search.worker",
            str(storage),
            str(log),
            "--seed",
            str(seed),
            "--max-evals",
            str(max_evals),
            "--sleep",
            str(sleep),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _log_lines(log: Path) -> list[tuple[str, str]]:
    if not log.exists():
        return []
    return [(p[0], p[2]) for p in (line.split(" ", 2) for line in log.read_text().splitlines())]


def _open(storage: Path) -> Search:
    return Search(space=grid_space(), storage=storage, study_name="shared")


@pytest.mark.parametrize("storage_kind", ["journal", "sqlite"])
def test_resume_keeps_finished_trials_and_repeats_none(tmp_path: Path, storage_kind: str) -> None:
    storage = tmp_path / "s.log" if storage_kind == "journal" else f"sqlite:///{tmp_path}/s.db"
    calls: list[dict[str, int]] = []

    def objective(config: dict[str, int]) -> Outcome:
        calls.append(config)
        return Outcome.ok(bowl(config))

    first = search(objective, space=grid_space(), storage=storage, max_evals=8, seed=0)
    assert len(first.history) == 8
    second = search(objective, space=grid_space(), storage=storage, max_evals=20, seed=1)
    assert second.new_evaluations == 12
    assert len(second.history) == 20
    assert second.history[:8] == first.history
    assert len({json.dumps(c, sort_keys=True) for c in calls}) == len(calls) == 20
    # A finished study is not re-run: the limit is study-wide.
    third = search(objective, space=grid_space(), storage=storage, max_evals=20, seed=2)
    assert third.new_evaluations == 0 and len(calls) == 20


def test_sigkilled_worker_resumes_without_loss_or_repeat(tmp_path: Path) -> None:
    storage, log = tmp_path / "study.log", tmp_path / "calls.log"
    proc = _worker(storage, log, seed=0, max_evals=40, sleep=0.3)
    deadline = time.monotonic() + 60
    # Kill it in the middle of its fifth evaluation.
    while sum(1 for kind, _ in _log_lines(log) if kind == "start") < 5:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "worker too slow"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lines = _log_lines(log)
    done_before = [c for kind, c in lines if kind == "done"]
    cut = [c for kind, c in lines if kind == "start" and c not in done_before]
    assert len(done_before) == 4 and len(cut) == 1

    engine = _open(storage)
    before = engine.study.get_trials()
    assert sum(t.state == TrialState.RUNNING for t in before) == 1
    kept = {t.number: t.params for t in before if t.state == TrialState.COMPLETE}
    assert len(kept) == 4

    rerun = _worker(storage, log, seed=1, max_evals=12, sleep=0.0)
    _out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    engine = _open(storage)
    trials = engine.study.get_trials()
    assert not any(t.state == TrialState.RUNNING for t in trials)
    for number, params in kept.items():  # finished trials kept as they were
        assert trials[number].state == TrialState.COMPLETE and trials[number].params == params
    abandoned = [t for t in trials if t.user_attrs.get("spectune.status") == "abandoned"]
    assert len(abandoned) == 1
    history = engine.history()
    assert len(history) == 12
    configs = [json.dumps(r.config, sort_keys=True) for r in history]
    assert len(set(configs)) == 12  # nothing evaluated twice
    assert cut[0] in configs  # the interrupted config was retried
    retried = next(r for r in history if json.dumps(r.config, sort_keys=True) == cut[0])
    assert retried.number > abandoned[0].number
    done_all = [c for kind, c in _log_lines(log) if kind == "done"]
    assert sorted(done_all) == sorted(configs)  # every finished evaluation is recorded once


def test_two_workers_share_one_study(tmp_path: Path) -> None:
    storage, log = tmp_path / "study.log", tmp_path / "calls.log"
    Search(space=grid_space(), storage=storage, study_name="shared")  # create it first
    procs = [_worker(storage, log, seed=s, max_evals=24, sleep=0.05) for s in (1, 2)]
    for p in procs:
        _out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    engine = _open(storage)
    trials = engine.study.get_trials()
    assert not any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials)
    history = engine.history()
    assert len(history) == 24
    configs = [json.dumps(r.config, sort_keys=True) for r in history]
    assert len(set(configs)) == 24
    starts = [c for kind, c in _log_lines(log) if kind == "start"]
    assert sorted(starts) == sorted(configs)  # no evaluation lost, none run twice
    pids = {line.split(" ")[1] for line in log.read_text().splitlines()}
    assert len(pids) == 2  # both workers did part of the work
    assert all(r.status is Status.OK for r in history)


def test_a_queued_retry_and_a_fresh_trial_do_not_both_take_the_last_slot(
    tmp_path: Path,
) -> None:
    """A retry waits in the queue with the number it was given when queued; a worker
    whose proposal was made before it was queued creates a fresh, higher-numbered trial.
    The fresh trial is admitted first, the retry later: the study must still end with
    exactly ``max_evals`` evaluations (the interleaving once charged one too many)."""
    storage = tmp_path / "study.log"
    first, second = (
        Search(space=grid_space(), storage=storage, study_name="shared", seed=s) for s in (0, 1)
    )
    max_evals = 5
    first.run(bowl_objective, max_evals=max_evals - 1)  # one slot left
    before_the_retry = second.study.get_trials(deepcopy=False)
    taken = [r.config for r in first.history()]
    configs = (first.index.config(i) for i in range(len(first.index)))
    retry = next(c for c in configs if c not in taken)
    first.study.enqueue_trial(retry)  # as a recovered trial's retry is queued
    fresh = second._start_trial(before_the_retry)  # proposed from the older read
    assert fresh.owned
    calls: list[dict[str, int]] = []

    def objective(config: dict[str, int]) -> Outcome:
        calls.append(config)
        return Outcome.ok(bowl(config))

    step = second._step(objective, fresh, max_evals)
    assert step == "max_evals" and calls == []  # the queued retry holds the last slot
    result = first.run(objective, max_evals=max_evals)
    assert calls == [retry]
    assert len(result.history) == max_evals
    statuses = [t.user_attrs.get("spectune.status") for t in first.study.get_trials()]
    assert statuses.count("surplus") == 1


def test_dead_worker_trial_is_retried_then_recorded_as_crash(tmp_path: Path) -> None:
    storage = tmp_path / "study.log"
    engine = Search(space=grid_space(), storage=storage, study_name="shared", max_retries=1)
    config = {"block": 64, "warps": 4, "stages": 3, "swizzle": 1}
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(dead.stdout)

    def plant() -> None:
        """A RUNNING trial on ``config`` owned by a process that no longer exists."""
        engine.study.enqueue_trial(config)
        trial = engine.study.ask(engine.index.distributions)
        engine.storage.set_trial_system_attr(
            trial._trial_id,
            "spectune.owner",
            {"host": os.uname().nodename, "pid": dead_pid, "start": None},
        )

    plant()
    calls: list[dict[str, int]] = []

    def crashing(c: dict[str, int]) -> Outcome:
        calls.append(c)
        if c == config:  # dies again: simulate by planting a new dead trial
            raise KeyboardInterrupt
        return Outcome.ok(bowl(c))

    with pytest.raises(KeyboardInterrupt):
        engine.run(crashing, max_evals=5)
    assert calls == [config]  # the abandoned config was retried first
    statuses = [t.user_attrs.get("spectune.status") for t in engine.study.get_trials()]
    assert statuses[:2] == ["abandoned", "interrupted"]

    plant()  # the worker evaluating it dies once more: beyond max_retries=1
    result = engine.run(bowl_objective, max_evals=3)
    crash = [r for r in result.history if r.failure == "crash"]
    assert len(crash) == 1 and crash[0].config == config
    assert crash[0].status is Status.FAIL
    assert len(result.history) == 3
    assert config not in [r.config for r in result.history if r.status is Status.OK]
