"""Isolated trials: a crash, an abort or a hang ends the worker process, not the search.

Runs ``tests.tuning.crash_family`` (a real Triton kernel whose ``FAULT`` knob aborts,
segfaults, exits or hangs its process) through :class:`IsolatedRunner`, alone and as
the objective of a whole :class:`Search`, and checks that every fault is recorded as a
failure with its reason, that a fresh worker takes the next trial, that a worker that
cannot start stops things with one clear line, and that no worker is left behind.
Each worker start costs a few seconds (imports), so the tests share one runner where
they can.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from optuna.trial import TrialState

from spectune.search import Outcome, Search, Status, search
from spectune.search._recording import FAILURE_KEY, MESSAGE_KEY, STATUS_KEY
from spectune.space import Problem
from spectune.tuning import IsolatedRunner
from spectune.tuning._isolated import TrialWorkerLost, WorkerStartError, describe_exit
from spectune.tuning.trial import TrialRunner
from tests.tuning.crash_family import FASTEST, FAULT_BLOCK, FAULTS, CrashFamily

BACKEND = "cpu-interpreter"
PROBLEM = Problem(spec_len=1, batch=2, vocab=256)
TIME_LIMIT = 3.0
# The watchdog kills a stuck trial at TIME_LIMIT plus its slack (1 s + 5%); allow for a
# loaded machine on top.
KILLED_WITHIN = TIME_LIMIT + 1.0 + 0.05 * TIME_LIMIT + 3.0


def config(block: int = FAULT_BLOCK, fault: str = "none") -> dict[str, int]:
    return {"BLOCK": block, "FAULT": FAULTS[fault]}


def child_pids() -> set[int]:
    """Processes whose parent is this one, zombies included (they are not reaped yet),
    but for multiprocessing's resource tracker: the first ``spawn`` in a process starts
    it, and it lives as long as the process (run alone, a test would count it)."""
    return _children() - _resource_tracker()


def _resource_tracker() -> set[int]:
    from multiprocessing import resource_tracker

    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    return {pid} if isinstance(pid, int) else set()


def _children() -> set[int]:
    try:
        import psutil
    except ImportError:
        me = str(os.getpid())
        pids = set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if fields[1] == me:
                pids.add(int(stat.parent.name))
        return pids
    return {p.pid for p in psutil.Process().children(recursive=True)}


def is_dead(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie waiting to be reaped counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def make_runner(family: CrashFamily | None = None, **kwargs: float) -> IsolatedRunner:
    return IsolatedRunner(family=family or CrashFamily(), problem=PROBLEM, backend=BACKEND,
                          seed=0, time_limit=kwargs.pop("time_limit", TIME_LIMIT), **kwargs)


@pytest.fixture(scope="module")
def runner() -> Iterator[IsolatedRunner]:
    """One runner for the tests that need a live worker (each start costs seconds)."""
    with make_runner() as shared:
        yield shared


def test_normal_configs_give_the_in_process_outcomes(runner: IsolatedRunner) -> None:
    pid = runner.worker_pid
    in_process = TrialRunner(family=CrashFamily(), problem=PROBLEM, backend=BACKEND, seed=0,
                             time_limit=TIME_LIMIT)
    for cfg in (config(), config(256), config(3), config(fault="wrong")):
        isolated, local = runner(cfg), in_process(cfg)
        assert (isolated.status, isolated.failure, isolated.message) == (
            local.status, local.failure, local.message), cfg
        assert set(isolated.attrs) == set(local.attrs)
        if isolated.status is Status.OK:
            assert isolated.attrs["p20_us"] <= isolated.time <= isolated.attrs["p80_us"]
            assert isolated.time == isolated.attrs["p50_us"]
    assert runner(config(3)).failure == "runtime"  # the interpreter's compile error
    assert runner(config(fault="wrong")).status is Status.INVALID
    assert runner.worker_pid == pid  # ordinary failures keep the worker


@pytest.mark.parametrize(
    ("fault", "death"),
    [("abort", "SIGABRT (signal 6)"), ("segfault", "SIGSEGV (signal 11)")],
)
def test_a_crash_kills_only_the_worker(runner: IsolatedRunner, fault: str, death: str) -> None:
    runner(config(256))  # a live worker to crash
    pid = runner.worker_pid
    outcome = runner(config(fault=fault))
    assert outcome == Outcome.failed("crash", f"worker process died: {death}")
    assert runner.worker_pid is None and pid not in child_pids()  # dead and reaped
    after = runner(config(256))
    assert after.status is Status.OK
    assert runner.worker_pid not in (None, pid)  # a fresh worker took the next trial


def test_a_hang_is_killed_at_the_time_limit(runner: IsolatedRunner) -> None:
    runner(config(256))
    pid = runner.worker_pid
    start = time.monotonic()
    outcome = runner(config(fault="hang"))
    took = time.monotonic() - start
    assert TIME_LIMIT <= took < KILLED_WITHIN
    assert outcome.status is Status.FAIL and outcome.failure == "timeout"
    assert outcome.message == (
        "trial exceeded its time limit of 3 s and did not stop; worker process killed")
    assert runner.worker_pid is None and pid not in child_pids()
    assert runner(config(256)).status is Status.OK
    assert runner.worker_pid not in (None, pid)


def test_an_overrun_the_worker_stops_itself_keeps_the_worker(runner: IsolatedRunner) -> None:
    runner(config(256))
    pid = runner.worker_pid
    outcome = runner(config(fault="slow"))  # interruptible: the worker's SIGALRM stops it
    assert outcome == Outcome.failed("timeout", "trial exceeded its time limit")
    assert runner.worker_pid == pid
    assert runner(config(256)).status is Status.OK and runner.worker_pid == pid


def test_a_worker_that_died_between_trials_is_replaced_uncharged(
    runner: IsolatedRunner, caplog: pytest.LogCaptureFixture
) -> None:
    runner(config(256))
    pid = runner.worker_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # e.g. the OOM killer, while no trial runs
    deadline = time.monotonic() + 10
    while not is_dead(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with caplog.at_level(logging.WARNING, logger="spectune.tuning._isolated"):
        outcome = runner(config(256))
    assert outcome.status is Status.OK  # the next trial is not blamed for it
    assert runner.worker_pid not in (None, pid) and pid not in child_pids()
    assert "trial worker died between trials (SIGKILL (signal 9))" in caplog.text


def test_a_worker_whose_death_shows_only_after_the_handover_is_replaced_uncharged(
    runner: IsolatedRunner, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed while idle, but seen alive when the next trial is handed over (a process
    stuck dying, here a stopped one): it never said it started the trial, so the trial
    goes to a fresh worker and is not blamed."""
    runner(config(256))
    pid = runner.worker_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # alive, silent: the liveness check passes
    killer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
    killer.start()
    try:
        with caplog.at_level(logging.WARNING, logger="spectune.tuning._isolated"):
            outcome = runner(config(256))
    finally:
        killer.join()
    assert outcome.status is Status.OK, outcome
    assert runner.worker_pid not in (None, pid) and pid not in child_pids()
    assert "trial worker died between trials (SIGKILL (signal 9))" in caplog.text


def test_a_search_records_crashes_and_hangs_as_failures(tmp_path: Path) -> None:
    before = child_pids()
    family = CrashFamily(faults=("wrong", "exit", "hang"))  # abort, segfault: tested above
    space = family.search_space(BACKEND)
    storage = str(tmp_path / "studies.journal")
    objective = make_runner(family)
    result = search(objective, space=space, storage=storage, study_name="crash",
                    seed=0, warm_start=[family.default_config(PROBLEM, BACKEND)])
    del objective  # not closed: collecting it ends its worker
    gc.collect()
    assert child_pids() <= before  # every worker of the search is gone, none a zombie
    assert result.stop_reason == "exhausted"
    assert result.best_config == FASTEST
    by_config = {(r.config["BLOCK"], r.config["FAULT"]): r for r in result.history}
    assert len(by_config) == len(result.history) == 6  # each config once
    for block, fault in ((3, "none"), (16, "wrong"), (16, "exit"), (16, "hang")):
        assert by_config[block, FAULTS[fault]].status is not Status.OK, (block, fault)
    assert by_config[FAULT_BLOCK, FAULTS["wrong"]].status is Status.INVALID

    trials = Search(space=space, storage=storage, study_name="crash").study.get_trials()
    attrs = {(t.params["BLOCK"], t.params["FAULT"]): (t.state, t.user_attrs) for t in trials}
    expected = {
        "exit": ("crash", "worker process died: exit code 3"),
        "hang": ("timeout", "trial exceeded its time limit of 3 s and did not stop; "
                            "worker process killed"),
    }
    for fault, (kind, message) in expected.items():
        state, user_attrs = attrs[FAULT_BLOCK, FAULTS[fault]]
        assert state == TrialState.FAIL
        assert user_attrs[STATUS_KEY] == "fail"
        assert (user_attrs[FAILURE_KEY], user_attrs[MESSAGE_KEY]) == (kind, message)


def test_a_worker_that_cannot_start_fails_the_constructor(tmp_path: Path) -> None:
    before = child_pids()
    refuse = tmp_path / "refuse"
    refuse.write_text("CUDA out of memory (simulated)\nsecond line")
    family = CrashFamily(start_failure_file=str(refuse))
    with pytest.raises(WorkerStartError) as info:
        make_runner(family)
    assert str(info.value) == (
        "crash_probe trial worker failed to start: RuntimeError: CUDA out of memory "
        "(simulated)")
    assert isinstance(info.value, RuntimeError)  # as the same error in-process is
    assert child_pids() <= before


def test_a_worker_not_ready_in_time_fails_the_constructor() -> None:
    before = child_pids()
    with pytest.raises(WorkerStartError, match=r"not ready within start_timeout=0\.2 s"):
        make_runner(start_timeout=0.2)  # imports alone take longer
    assert child_pids() <= before


def test_a_family_that_cannot_be_pickled_is_refused() -> None:
    class Local(CrashFamily):  # not importable by a worker
        pass

    with pytest.raises(TypeError, match="cannot be sent to a worker process"):
        make_runner(Local())


@pytest.mark.parametrize("name", ["time_limit", "start_timeout"])
@pytest.mark.parametrize("value", [0, -1.0, float("inf"), True])
def test_limits_are_checked(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=name):
        make_runner(**{name: value})


def test_a_worker_that_cannot_restart_stops_the_search(tmp_path: Path) -> None:
    before = child_pids()
    refuse = tmp_path / "refuse"
    family = CrashFamily(faults=("abort",), start_failure_file=str(refuse))
    space = family.search_space(BACKEND)
    storage = str(tmp_path / "studies.journal")
    with make_runner(family) as objective:
        refuse.write_text("CUDA out of memory (simulated)")  # from the next start on
        engine = Search(space=space, storage=storage, study_name="lost",
                        warm_start=[config(fault="abort"), config(256)])
        with pytest.raises(TrialWorkerLost) as info:
            engine.run(objective)
        assert str(info.value) == (
            "trial worker could not be restarted: crash_probe trial worker failed to start: "
            "RuntimeError: CUDA out of memory (simulated)")
        assert isinstance(info.value.__cause__, WorkerStartError)
        assert not isinstance(info.value, Exception)  # the engine lets it through
        # The crash is recorded; the config that never ran is not charged, and retried.
        assert [(r.config, r.failure) for r in engine.history()] == [
            (config(fault="abort"), "crash")]
        interrupted = [t for t in engine.study.get_trials()
                       if t.user_attrs.get(STATUS_KEY) == "interrupted"]
        assert [t.params for t in interrupted] == [config(256)]

        refuse.unlink()  # the device is back: the same runner starts a worker again
        result = engine.run(objective, max_evals=2)
        assert result.history[-1].config == config(256)
        assert result.history[-1].status is Status.OK
    assert child_pids() <= before
    with pytest.raises(RuntimeError, match="closed"):
        objective(config(256))
    objective.close()  # idempotent


def test_describe_exit() -> None:
    assert describe_exit(-6) == "SIGABRT (signal 6)"
    assert describe_exit(-9) == "SIGKILL (signal 9)"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(-200) == "unknown signal (signal 200)"
    assert describe_exit(None) == "exit status unknown"
