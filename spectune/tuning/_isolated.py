"""Trials in a child process: a crash, an abort or a hung kernel ends the trial, not the sweep.

:class:`IsolatedRunner` is an objective like :class:`~spectune.tuning.trial.TrialRunner`
(it returns the same :class:`Outcome` for a configuration), but the trial runs in one
worker process of its own, started with ``spawn`` (never ``fork``: a CUDA or HIP context
does not survive a fork), which builds its ``TrialRunner`` (imports, inputs, reference)
once and then serves trials over a pipe. The calling process is the watchdog:

* a worker that dies during a trial (illegal memory access, ``abort()``, ``os._exit``, a
  signal) makes that trial a ``crash`` failure naming the exit code or signal;
* a trial that has not answered ``time_limit`` seconds (plus a little slack) after it was
  sent is a ``timeout`` failure, and its worker is killed (SIGKILL): a SIGALRM cannot
  interrupt a blocked device sync, a kill from outside can;
* either way the next trial starts a fresh worker first. A trial the worker's own time
  limit interrupts (SIGALRM) is a ``timeout`` failure too, and the worker goes on.

Starting a worker can fail (an import error, inputs that do not fit on the device): the
constructor raises :class:`WorkerStartError` (a ``RuntimeError``), where ``TrialRunner``
itself would raise. Failing to start a replacement later raises :class:`TrialWorkerLost`,
which is *not* an ``Exception`` (see there why).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING

from spectune.messages import one_line
from spectune.search import Outcome
from spectune.space import Problem

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess
    from types import TracebackType

    from spectune.kernels import KernelFamily

__all__ = ["IsolatedRunner", "TrialWorkerLost", "WorkerStartError", "describe_exit"]

_log = logging.getLogger(__name__)

# The watchdog waits this much longer than the trial's time limit before it kills the
# worker, so that a limit the worker's own SIGALRM enforces comes back as an answer (and
# the worker, with its inputs, is kept); only a trial stuck where no signal handler runs
# (a blocked device sync, a long C call) is killed.
_SLACK_S = 1.0
_SLACK_FRACTION = 0.05
# How long close() lets an idle worker exit on its own before it is killed.
_STOP_GRACE_S = 2.0
# How long to wait for a killed worker to be reaped (a process stuck in the kernel, in
# uninterruptible sleep, dies only when that call returns).
_REAP_S = 10.0
# prctl(2) option: the signal a process gets when the thread that started it exits.
_PR_SET_PDEATHSIG = 1


class WorkerStartError(RuntimeError):
    """A trial worker process could not start: its error, exit or start time-out.

    A ``RuntimeError``, as the same failure in an in-process ``TrialRunner`` is (torch's
    out-of-memory errors are runtime errors): the message carries the worker's own
    error as ``Type: message``.
    """


class TrialWorkerLost(BaseException):
    """A replacement trial worker could not start: trials cannot go on in this process.

    Raised by :meth:`IsolatedRunner.__call__` when the worker died (in a trial or idle)
    and a new one fails to start. It derives from ``BaseException``, like
    ``KeyboardInterrupt``, on purpose: the search engine records any ``Exception`` an
    objective raises as an ``other`` failure of the configuration at hand and goes on,
    so an ``Exception`` would mark every remaining proposal failed (configurations that
    never ran, and are never retried in the study) while burning the budget on start
    attempts. Through this one the engine marks the trial interrupted (not charged,
    retried first on resume) and the search stops with the start error as its message;
    its ``__cause__`` is the :class:`WorkerStartError`.
    """


class _Slot:
    """The current worker process and its pipe, if any: what close() and the
    finalizer clean up (kept apart from the runner, so the finalizer holds no runner)."""

    def __init__(self) -> None:
        self.process: BaseProcess | None = None
        self.conn: Connection | None = None

    def stop(self, *, graceful: bool = True) -> int | None:
        """End the worker (asked to exit, else killed) and reap it; its exit code."""
        process, conn = self.process, self.conn
        self.process = self.conn = None
        if process is None or conn is None:
            return None
        if graceful and process.is_alive():
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)  # the worker's loop ends on None
            process.join(_STOP_GRACE_S)
        if process.is_alive():
            process.kill()  # SIGKILL: the one signal a stuck worker cannot block
            process.join(_REAP_S)
        code = process.exitcode
        conn.close()
        if code is None:
            _log.warning("trial worker %s did not die within %g s of SIGKILL",
                         process.pid, _REAP_S)
        else:
            process.close()  # its sentinel's file descriptor; reaped by the join above
        return code


class IsolatedRunner:
    """Runs trials of one kernel family on one problem in a worker process.

    An objective for :class:`~spectune.search.Search`: ``runner(config)`` returns the
    :class:`Outcome` a :class:`~spectune.tuning.trial.TrialRunner` with the same
    arguments returns (``ok`` with p20/p50/p80 in its attrs, ``invalid``, ``failed``
    with ``compile``, ``runtime``... ), and also survives configurations that take their
    process down: ``failed("crash")`` when the worker dies during the trial,
    ``failed("timeout")`` when it does not answer in time (it is then killed). The next
    trial starts a fresh worker. Not thread-safe: one trial at a time.

    The worker starts in the constructor (so a family whose inputs cannot be made fails
    here, as ``TrialRunner`` does). It is a daemon process, dies with the thread that
    started it (Linux, when that is the main thread), is stopped by :meth:`close` or by
    leaving a ``with`` block, killed when the runner is garbage collected or the
    interpreter exits, and is always reaped (no zombie).

    Args:
        family: The kernel family. It is pickled once, here, and unpickled in each
            worker, so its class must be importable there (a module-level class of an
            importable module: ``spawn`` gives the worker this process's ``sys.path``);
            changes to the object after construction do not reach the workers.
        problem: The shape being tuned.
        backend: ``hip``, ``cuda`` or ``cpu-interpreter``.
        seed: Seed of the trial inputs.
        time_limit: Seconds a trial may take (compile + gate + timing), enforced in the
            worker by SIGALRM and, past a small slack, by killing it; ``None``: no limit
            (a crash is still caught).
        start_timeout: Seconds a worker may take to be ready (imports, inputs, the
            reference); not part of any trial's time limit.

    Raises:
        WorkerStartError: the first worker could not start (its error in one line).
        TypeError: ``family`` or ``problem`` cannot be pickled.
        ValueError: naming the argument, for a limit that is not a finite number > 0.
    """

    def __init__(
        self,
        *,
        family: KernelFamily,
        problem: Problem,
        backend: str,
        seed: int = 0,
        time_limit: float | None = 120.0,
        start_timeout: float = 300.0,
    ) -> None:
        if time_limit is not None:
            _check_positive("time_limit", time_limit)
        _check_positive("start_timeout", start_timeout)
        self.family = family
        self.problem = problem
        self.backend = backend
        self.seed = seed
        self.time_limit = None if time_limit is None else float(time_limit)
        self.start_timeout = float(start_timeout)
        try:
            self._payload = pickle.dumps((family, problem))
        except Exception as exc:  # PicklingError, AttributeError (local class), TypeError
            raise TypeError(
                f"family {getattr(family, 'name', family)!r} cannot be sent to a worker "
                f"process: {type(exc).__name__}: {one_line(exc)}"
            ) from None
        self._ctx = multiprocessing.get_context("spawn")
        self._slot = _Slot()
        self._closed = False
        # Kills the worker when the runner is collected or at interpreter exit: a
        # finalizer runs wherever the collector happens to run, so it must not wait for
        # a polite exit, and an idle worker holds nothing that a kill would lose.
        self._finalizer = weakref.finalize(self, self._slot.stop, graceful=False)
        self._start()

    # -- the objective ----------------------------------------------------------------

    def __call__(self, config: Mapping[str, int]) -> Outcome:
        """Run one trial of ``config`` in the worker, watching it.

        Returns:
            The worker's :class:`Outcome`; ``failed("crash")`` when it died,
            ``failed("timeout")`` when it ran past ``time_limit`` and was killed.

        Raises:
            TrialWorkerLost: a dead worker's replacement could not start.
            RuntimeError: the runner is closed.
        """
        if self._closed:
            raise RuntimeError("this IsolatedRunner is closed")
        handed = self._hand_over(config)
        if isinstance(handed, Outcome):
            return handed
        conn = handed
        limit = self.time_limit
        deadline = None if limit is None else (
            time.monotonic() + limit + _SLACK_S + _SLACK_FRACTION * limit)
        try:
            state = self._await(deadline)
            if state == "answer":
                kind, value = conn.recv()
                if kind == "outcome" and isinstance(value, Outcome):
                    return value
                self._slot.stop(graceful=False)  # it no longer follows the protocol
                return Outcome.failed("other", f"unexpected answer from the worker: {kind!r}")
        except (EOFError, ConnectionError):
            state = "died"  # it closed its end while dying
        except pickle.UnpicklingError as exc:
            self._slot.stop(graceful=False)
            return Outcome.failed("other", f"unreadable answer from the worker: {one_line(exc)}")
        except BaseException:
            # Interrupted (Ctrl-C...) mid-trial: the worker's state is unknown, and it may
            # be stuck where no signal reaches it; it must not outlive this call.
            self._slot.stop(graceful=False)
            raise
        if state == "died":
            code = self._slot.stop(graceful=False)
            return Outcome.failed("crash", f"worker process died: {describe_exit(code)}")
        self._slot.stop(graceful=False)
        return Outcome.failed(
            "timeout",
            f"trial exceeded its time limit of {limit:g} s and did not stop; "
            "worker process killed",
        )

    # -- lifetime ---------------------------------------------------------------------

    @property
    def worker_pid(self) -> int | None:
        """The process id of the current worker; ``None`` when there is none."""
        process = self._slot.process
        return None if process is None else process.pid

    def close(self) -> None:
        """Stop the worker (asked to exit, killed if it does not within 2 s) and reap it.

        Idempotent; a closed runner refuses trials.
        """
        self._closed = True
        if self._finalizer.detach() is not None:
            self._slot.stop(graceful=True)

    def __enter__(self) -> IsolatedRunner:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------

    def _hand_over(self, config: Mapping[str, int]) -> Connection | Outcome:
        """Give ``config`` to a live worker and wait until it says it started the trial.

        A worker that dies before saying so (killed while idle, by the OOM killer or a
        signal, however late its death shows) never ran the trial: it is replaced and the
        trial handed to the new one, once; nothing is charged to the trial.
        """
        conn = self._ready_conn()
        for attempt in (1, 2):
            try:
                conn.send(dict(config))
                if self._await(time.monotonic() + self.start_timeout) == "answer":
                    kind, _ = conn.recv()
                    if kind == "started":
                        return conn
                    self._slot.stop(graceful=False)  # it no longer follows the protocol
                    return Outcome.failed(
                        "other", f"unexpected answer from the worker: {kind!r}")
            except (OSError, EOFError, ConnectionError):
                pass  # it died before taking the trial
            except BaseException:  # interrupted: it must not outlive this call
                self._slot.stop(graceful=False)
                raise
            self._drop_dead_worker()
            if attempt == 2:
                break
            conn = self._ready_conn()
        return Outcome.failed(
            "crash", "trial worker died twice before it could start the trial")

    def _drop_dead_worker(self) -> None:
        """Reap a worker that died between trials; nothing is charged to a trial."""
        code = self._slot.stop(graceful=False)
        _log.warning("trial worker died between trials (%s); starting a new one",
                     describe_exit(code))

    def _ready_conn(self) -> Connection:
        """The pipe of a live worker, starting one when there is none."""
        process, conn = self._slot.process, self._slot.conn
        # Between trials a live worker has nothing to say: a readable pipe is the EOF of
        # one that died (its end closes when it exits, before anyone reaps it), which
        # is_alive() alone may not see yet.
        if process is not None and conn is not None and process.is_alive() \
                and not _readable(conn):
            return conn
        if process is not None:
            self._drop_dead_worker()
        try:
            return self._start()
        except WorkerStartError as exc:
            raise TrialWorkerLost(f"trial worker could not be restarted: {exc}") from exc

    def _start(self) -> Connection:
        """Start a worker and wait until it is ready.

        Raises:
            WorkerStartError: it failed, died or timed out while starting.
        """
        name = getattr(self.family, "name", "?")
        parent_conn, child_conn = self._ctx.Pipe()
        # PR_SET_PDEATHSIG fires when the *thread* that started the worker ends: only
        # the main thread lives as long as the process.
        die_with_parent = threading.current_thread() is threading.main_thread()
        process = self._ctx.Process(
            target=_worker_main,
            args=(child_conn, self._payload, self.backend, self.seed, self.time_limit,
                  os.getpid(), die_with_parent),
            name=f"spectune-trials-{name}",
            daemon=True,
        )
        try:
            process.start()
        except Exception as exc:  # e.g. started from a daemonic process
            parent_conn.close()
            child_conn.close()
            raise WorkerStartError(
                f"{name} trial worker failed to start: {type(exc).__name__}: {one_line(exc)}"
            ) from None
        child_conn.close()  # this process keeps one end only, so a dead worker reads as EOF
        self._slot.process, self._slot.conn = process, parent_conn
        reason = None
        try:
            state = self._await(time.monotonic() + self.start_timeout)
            if state == "answer":
                kind, value = parent_conn.recv()
                if kind == "ready":
                    return parent_conn
                reason = str(value) if kind == "error" else f"unexpected answer {kind!r}"
        except (EOFError, ConnectionError):
            state = "died"
        except BaseException:
            self._slot.stop(graceful=False)
            raise
        code = self._slot.stop(graceful=False)
        if reason is None:
            reason = (f"worker process died: {describe_exit(code)}" if state == "died"
                      else f"not ready within start_timeout={self.start_timeout:g} s")
        raise WorkerStartError(f"{name} trial worker failed to start: {one_line(reason)}")

    def _await(self, deadline: float | None) -> str:
        """``answer`` (something to read), ``died`` or ``timeout``, whichever comes first."""
        process, conn = self._slot.process, self._slot.conn
        assert process is not None and conn is not None
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = wait([conn, process.sentinel], timeout)
        # An answer sent just before dying is still an answer.
        if conn in ready or conn.poll():
            return "answer"
        return "died" if ready else "timeout"


def _readable(conn: Connection) -> bool:
    try:
        return conn.poll(0)
    except (OSError, EOFError):
        return True


def describe_exit(code: int | None) -> str:
    """A worker's exit in words: ``SIGABRT (signal 6)``, ``exit code 3``...

    Args:
        code: ``multiprocessing``'s exit code: ``-N`` for signal ``N``, ``None`` while
            running (or not reaped).
    """
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"{name} (signal {-code})"
    return f"exit code {code}"


def _check_positive(name: str, value: object) -> None:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and value > 0)
    if not ok:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


# -- the worker process ---------------------------------------------------------------


def _worker_main(
    conn: Connection,
    payload: bytes,
    backend: str,
    seed: int,
    time_limit: float | None,
    parent_pid: int,
    die_with_parent: bool,
) -> None:
    """The worker: build a ``TrialRunner``, say ``ready`` (or why not), then answer each
    config with its ``Outcome`` until told to stop (``None``) or the parent is gone."""
    # Ctrl-C reaches the whole process group: the parent decides (and kills this worker);
    # a KeyboardInterrupt here would only print a second traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if die_with_parent:
        _die_with_parent(parent_pid)
    try:
        # Imported here: spectune.search stays free of torch for the parent's imports.
        from spectune.tuning.trial import TrialRunner

        family, problem = pickle.loads(payload)
        runner = TrialRunner(family=family, problem=problem, backend=backend, seed=seed,
                             time_limit=time_limit)
    except Exception as exc:  # import errors, inputs that do not fit, a bad family
        conn.send(("error", f"{type(exc).__name__}: {one_line(exc)}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            config = conn.recv()
        except (EOFError, OSError):  # the parent closed its end or is gone
            return
        if config is None:
            return
        conn.send(("started", None))  # from here on, a death is this trial's doing
        try:
            outcome = runner(config)
        except Exception as exc:  # as the engine records an objective's exception
            outcome = Outcome.failed("other", f"{type(exc).__name__}: {one_line(exc)}")
        try:
            conn.send(("outcome", outcome))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # odd attrs
            conn.send(("outcome", Outcome.failed(
                "other", f"outcome cannot be sent back: {one_line(exc)}")))


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this worker when its parent dies (Linux), so that not even
    a parent killed with SIGKILL leaves a worker behind; exit if it is already gone."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # it died before the prctl took effect
        os._exit(0)

