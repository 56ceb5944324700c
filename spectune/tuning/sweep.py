"""A sweep: one correctness-gated study per problem, promoted into the configs database.

For each (kernel, k, batch, vocab, dtype, draft probs) on the current device:

1. open (or resume) the problem's Optuna study in ``storage``;
2. warm-start it with the kernel's default config, and let it try what the database
   knows (the best configs of neighbouring problems on this device, then of the same
   kernel on other GPU models) on alternate turns while they keep improving
   (:class:`~spectune.search.TransferStrategy`; ``--no-transfer`` to start cold);
3. run trials (compile -> gate against the reference -> time) until a stop condition;
4. measure the study's best again side by side with its closest runners-up (each trial
   was timed in one window, where a neighbour's load can reorder configs that are
   close), and keep whichever the promotion rule finds faster;
5. promote the best config into the database only when it is faster than the
   incumbent (the database's row for the problem, else the default) by the promotion
   rule (>= 3% at p50 and non-overlapping p20-p80 ranges), the two measured side by side
   in this run until the rule decides (:func:`spectune.promotion.decide_side_by_side`);
   the row carries its provenance. A best config the database already holds is up to
   date, and so is a row this study wrote with no trial run since: nothing is measured
   again, so a rerun of a finished study keeps its verdict;
6. measure the config that now serves the shape (the row's, else the default) side by
   side with the installed vLLM's own function (:mod:`spectune.tuning._vs_vllm`) and
   record the verdict on the row: "faster", "not faster" or "not measured" with the
   reason. A shape whose default serves gets a row with the default config when vLLM
   was measured, so every shape measured against vLLM has its verdict in the database.
   Without vLLM the sweep runs as before and says once that verdicts need vLLM.
"""

from __future__ import annotations

import functools
import logging
import math
import multiprocessing
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spectune.identity import DeviceIdentity, SoftwareIdentity, detect_device, detect_software
from spectune.kernels import KernelFamily, family_space, get_family
from spectune.messages import one_line
from spectune.promotion import Timing, decide_side_by_side
from spectune.search import (
    STRATEGIES,
    Search,
    SearchObserver,
    Strategy,
    TransferStrategy,
    TrialRecord,
    make_strategy,
    search,
    studies_beside,
    succeeded,
    time_order,
)
from spectune.tuning._isolated import IsolatedRunner, TrialWorkerLost, WorkerStartError
from spectune.tuning.problems import SweepItem, study_name
from spectune.tuning.trial import TrialRunner

if TYPE_CHECKING:
    from spectune.db import Store, TunedRow, VllmComparison

logger = logging.getLogger("spectune.tuning")

__all__ = ["MAX_SEED", "SweepOptions", "SweepResult", "default_storage", "max_workers",
           "run_item", "study_attrs"]

# Worker i of a study seeds its sampler with seed + stride * i + pid % stride: apart from
# the main process's and each other's.
_WORKER_SEED_STRIDE = 1000
#: Largest seed: Optuna's samplers take seeds below 2**32 (numpy's RandomState), and
#: the workers of a study add less than ``1000 * workers`` to theirs; 2**31 - 1 leaves
#: them that room.
MAX_SEED = 2**31 - 1


def max_workers() -> int:
    """Most processes that may share one study from one command: four per CPU core.

    Each is a process of its own (its own imports and inputs) compiling and gating
    trials; a few per core keep a GPU busy while others compile, many more only queue
    up and hold memory. Never fewer than four, so a small machine can still run a
    multi-worker sweep.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return 4 * max(cores, 1)


@dataclass(frozen=True)
class SweepOptions:
    """Limits and places of a sweep (see ``spectune sweep --help``).

    Checked when made, before any input is made or trial run.

    Raises:
        ValueError: naming the field, for a value out of its range or an unknown sampler.
    """

    trials: int | None = 30
    time_budget: float | None = None
    patience: int | None = None
    db: str | None = None
    storage: str | None = None
    workers: int = 1
    sampler: str = "auto"
    seed: int = 0
    trial_time_limit: float | None = 300.0
    #: Start each study from the database's prior (:func:`transfer_prior`).
    transfer: bool = True
    #: How many of the study's fastest configs (its best and the runners-up within
    #: ``finalist_ratio`` of its time) are measured again side by side before promotion;
    #: 1 promotes the study's best as it was timed.
    finalists: int = 3
    #: How far behind the best (the ratio of the recorded medians) a runner-up may be.
    finalist_ratio: float = 1.5
    #: Run each trial in a child process with a watchdog
    #: (:class:`~spectune.tuning.IsolatedRunner`): a crash, an abort or a hung kernel
    #: fails the trial, not the sweep. ``None``: on GPUs, not under the CPU interpreter
    #: (where nothing can crash the process and a worker's start costs seconds).
    isolate: bool | None = None
    #: Measure the serving config beside the installed vLLM's own function and record
    #: the verdict (:mod:`spectune.tuning._vs_vllm`).
    vs_vllm: bool = True

    def __post_init__(self) -> None:
        for name, low, high, optional in (
            ("trials", 1, None, True),
            ("patience", 1, None, True),
            ("workers", 1, max_workers(), False),
            ("seed", 0, MAX_SEED, False),
            ("finalists", 1, None, False),
        ):
            value = getattr(self, name)
            if value is None and optional:
                continue
            if (isinstance(value, bool) or not isinstance(value, int) or value < low
                    or (high is not None and value > high)):
                bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
                raise ValueError(f"{name} must be an integer {bounds}, got {value!r}")
        ratio = self.finalist_ratio
        if (isinstance(ratio, bool) or not isinstance(ratio, (int, float))
                or not math.isfinite(ratio) or ratio < 1):
            raise ValueError(f"finalist_ratio must be a finite number >= 1, got {ratio!r}")
        for name in ("time_budget", "trial_time_limit"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value <= 0
            ):
                raise ValueError(f"{name} must be a finite number > 0 or None, got {value!r}")
        if not isinstance(self.vs_vllm, bool):
            raise ValueError(f"vs_vllm must be True or False, got {self.vs_vllm!r}")
        if self.isolate is not None and not isinstance(self.isolate, bool):
            raise ValueError(f"isolate must be True, False or None, got {self.isolate!r}")
        if isinstance(self.sampler, str) and self.sampler not in STRATEGIES:
            raise ValueError(f"sampler must be one of {sorted(STRATEGIES)}, got {self.sampler!r}")


@dataclass(frozen=True)
class SweepResult:
    """What one problem's study found (one line of the final table)."""

    item: SweepItem
    study: str
    default_config: dict[str, int]
    default: Timing | None
    best_config: dict[str, int] | None
    best: Timing | None
    trials: int
    failed: int
    invalid: int
    stop_reason: str
    # inserted | replaced | kept | unchanged (the database's verdict on a faster best),
    # not faster (than the incumbent, which stays), up to date (the database already
    # holds the best), default is best, no result; default row (no faster best: a row
    # with the default config holds the verdict against vLLM)
    promoted: str
    seconds: float
    #: At which of the study's evaluations its best was found (``None`` without one).
    best_evaluation: int | None = None
    #: The serving config against vLLM's own function (``None``: not compared).
    vllm: VllmComparison | None = None
    #: The serving config's timing in that comparison.
    served: Timing | None = None

    @property
    def vs_vllm(self) -> float | None:
        """vLLM's median over the serving config's (above 1: spectune is faster), when
        both were measured side by side."""
        if self.vllm is None or self.vllm.p50_us is None or self.served is None:
            return None
        return self.vllm.p50_us / self.served.p50

    @property
    def speedup(self) -> float | None:
        """The default's median over the best's; exactly 1 when the default is the best
        (one measurement stands for both)."""
        if self.default is None or self.best is None:
            return None
        return self.default.p50 / self.best.p50


def default_storage(db: str | None = None) -> str:
    """Where a sweep into ``db`` keeps its studies by default: where the configs live
    (:func:`~spectune.search._storage.studies_beside`: a journal file beside a SQLite
    database, the same PostgreSQL database). A sweep into another database never resumes
    a study recorded for this one.

    Args:
        db: The configs database (``--db``); ``None``: where writers write
            (``SPECTUNE_DB`` or the user database).
    """
    return studies_beside(db)


def study_attrs(item: SweepItem, device: DeviceIdentity, kernel_hash: str) -> dict[str, object]:
    """What a study tunes, as its user attributes (shown by ``optuna-dashboard``)."""
    p = item.problem
    return {"kernel": item.kernel, "kernel_hash": kernel_hash, "k": p.spec_len,
            "batch": p.batch, "vocab": p.vocab, "dtype": p.dtype,
            "draft_probs": p.draft_probs, "device": device.device_name,
            "backend": device.backend, "arch": device.arch}


def run_item(
    item: SweepItem,
    *,
    options: SweepOptions,
    observers: Sequence[SearchObserver] = (),
    device: DeviceIdentity | None = None,
    software: SoftwareIdentity | None = None,
    study_suffix: str = "",
    supersede: bool = False,
) -> SweepResult:
    """Tune one problem and promote its best config; see the module docstring.

    Args:
        item: The kernel and problem.
        options: Limits and places.
        observers: Receive the study's progress.
        device: This device (detected when ``None``).
        software: This software (detected when ``None``).
        study_suffix: Appended to the study's name: a fresh study for the same problem
            (the nightly re-tune of a regressed or stale row, whose old study holds
            timings of another system).
        supersede: The database's row of this key describes another system (changed
            software or drivers) or has regressed: the study's best replaces it when it
            beats the default side by side, and the row is removed when nothing does
            (verdicts ``replaced``, ``removed``), instead of the promotion rule weighing
            the best against the row's old figures.
    """
    from spectune.db import open_store

    if not isinstance(options, SweepOptions):
        raise TypeError(f"options must be SweepOptions, got {type(options).__name__}")
    started = time.monotonic()
    device = device or detect_device()
    software = software or detect_software()
    family = get_family(item.kernel)
    space = family.search_space(device.backend)
    storage = str(options.storage or default_storage(options.db))
    name = study_name(device, item, family.source_hash) + study_suffix
    store = open_store(options.db)
    try:
        default_config = family.default_config(item.problem, device.backend)
        warm = [default_config]
        prior = transfer_prior(store, item=item, device=device, software=software,
                               kernel_hash=family.source_hash) if options.transfer else []
        isolate = _isolates(options, device.backend)
        helpers = _start_helpers(item, options, storage, name, warm, prior,
                                 count=options.workers - 1, isolate=isolate)
        try:
            with _objective(family, item, device.backend, options, isolate) as objective:
                result = search(
                    objective, space=space, max_evals=options.trials,
                    time_budget=options.time_budget, patience=options.patience,
                    warm_start=warm, sampler=_sampler(options, options.seed, prior),
                    seed=options.seed, storage=storage, study_name=name,
                    observers=observers,
                    user_attrs=study_attrs(item, device, family.source_hash),
                )
        finally:
            for proc in helpers:
                proc.join()
        # Promotion times configs the study already ran correctly, in this process;
        # an isolated study's worker (and its device memory) is gone by now.
        runner = (objective if isinstance(objective, TrialRunner) else
                  TrialRunner(family=family, problem=item.problem, backend=device.backend,
                              seed=options.seed, time_limit=options.trial_time_limit))
        history, best = result.history, result.best
        if helpers:
            # This process stopped first; the study now also holds the workers' last trials.
            engine = Search(space=space, storage=storage, study_name=name)
            history, best = tuple(engine.history()), engine.best()
        failed = sum(1 for r in history if r.status.value == "fail")
        invalid = sum(1 for r in history if r.status.value == "invalid")
        best_config = None if best is None else dict(best.config)
        default_t = best_t = None
        promoted = "no result"
        if best is not None:
            runners_up = _runners_up(history, best, count=options.finalists - 1,
                                     ratio=options.finalist_ratio)
            promoted, default_t, best_t, best_config = _promote(
                _Promotion(item=item, family=family, runner=runner, device=device,
                           software=software, study=name, trials=len(history),
                           started=started),
                store=store, best_config=best_config, default_config=default_config,
                runners_up=[dict(r.config) for r in runners_up], supersede=supersede,
            )
            best = next((r for r in [best, *runners_up] if r.config == best_config), best)
        vllm = served = None
        if options.vs_vllm and best_t is not None:
            vllm, served, promoted = _against_vllm(
                _Promotion(item=item, family=family, runner=runner, device=device,
                           software=software, study=name, trials=len(history),
                           started=started),
                store=store, default_config=default_config, default_t=default_t,
                promoted=promoted)
        return SweepResult(
            item=item, study=name, default_config=default_config, default=default_t,
            best_config=best_config, best=best_t, trials=len(history), failed=failed,
            invalid=invalid, stop_reason=result.stop_reason, promoted=promoted,
            seconds=time.monotonic() - started,
            best_evaluation=None if best is None else best.evaluation,
            vllm=vllm, served=served,
        )
    finally:
        store.close()


@dataclass(frozen=True)
class _Promotion:
    """What promoting one study's best config needs to know of the study."""

    item: SweepItem
    family: KernelFamily
    runner: TrialRunner
    device: DeviceIdentity
    software: SoftwareIdentity
    study: str
    trials: int
    started: float


def _runners_up(history: Sequence[TrialRecord], best: TrialRecord, *, count: int,
                ratio: float) -> list[TrialRecord]:
    """The ``count`` fastest other configs of the study whose recorded time is within
    ``ratio`` of its best's, fastest first (each config once: a resumed study may hold
    repeats).

    A trial is timed in one window, and a neighbour's load during it (another process on
    the GPU or the host) can slow it by a good part; the default ratio, 1.5, takes in
    what such a load can reorder, and configs further behind are slower whatever the load.
    """
    assert best.time is not None
    seen = [best.config]
    found: list[TrialRecord] = []
    for record in sorted(succeeded(history), key=time_order):
        if len(found) >= count or record.time > best.time * ratio:  # type: ignore[operator]
            break
        if record.config not in seen:
            seen.append(record.config)
            found.append(record)
    return found


def _rematch(best_config: dict[str, int], runners_up: Sequence[dict[str, int]],
             timer: Callable[[dict[str, int]], Timing]) -> dict[str, int]:
    """The study's best, or the runner-up that beats it (and every runner-up before it)
    side by side by the promotion rule."""
    champion = best_config
    for config in runners_up:
        decision = decide_side_by_side(functools.partial(timer, config),
                                       functools.partial(timer, champion))
        if decision.faster:
            champion = config
    return champion


def _promote(
    study: _Promotion, *, store: Store, best_config: dict[str, int],
    default_config: dict[str, int], runners_up: Sequence[dict[str, int]] = (),
    supersede: bool = False,
) -> tuple[str, Timing | None, Timing | None, dict[str, int]]:
    """Decide which of the study's finalists is its best and whether it goes into the
    database.

    Args:
        study: The study.
        store: The configs database.
        best_config: The study's best, as timed in its trial.
        default_config: The kernel's default for the problem.
        runners_up: The study's next fastest configs, measured again side by side with
            the best (:func:`_rematch`) unless the database's row already settles it.
        supersede: See :func:`run_item`.

    Returns:
        What happened (:attr:`SweepResult.promoted`), the default's and the best's
        timings to report, and the best config.
    """
    family, runner = study.family, study.runner

    def timer(config: dict[str, int]) -> Timing:
        return runner.timer(lambda: family.launch(runner.inputs, config))

    held = _held(study, store)
    if supersede and held is not None:
        best_config = _rematch(best_config, runners_up, timer)
        return (*_supersede(study, store=store, held=held, best_config=best_config,
                            default_config=default_config, timer=timer), best_config)
    if held is not None and (
        held.config == best_config
        # This study's own verdict, with no trial since: its finalists were weighed then.
        or (held.study == study.study and held.trials == study.trials
            and held.config in [best_config, *runners_up])
    ):
        # Nothing to decide: measuring again could only turn noise into a verdict. Its
        # own figures are the ones it was promoted on (side by side, in one run).
        return "up to date", held.default, held.tuned, held.config
    best_config = _rematch(best_config, runners_up, timer)
    if held is not None and held.config == best_config:
        return "up to date", held.default, held.tuned, best_config
    if best_config == default_config:
        # One measurement stands for both: a config is never faster than itself.
        default_t = timer(default_config)
        return "default is best", default_t, default_t, best_config
    incumbent = default_config if held is None else held.config
    decision = decide_side_by_side(lambda: timer(best_config), lambda: timer(incumbent))
    default_t = decision.incumbent if held is None else timer(default_config)
    if not decision.faster:
        verdict = "not faster" if held is None else "kept"
        return verdict, default_t, decision.candidate, best_config
    row = _row(study, best_config, tuned=decision.candidate, default=default_t)
    # The database weighs the row against the timings it holds (as merges do), so a row
    # it holds is replaced only when both this run and its figures agree.
    return (store.record(row, spaces=family_space).value, default_t, decision.candidate,
            best_config)


def _row(study: _Promotion, config: dict[str, int], *, tuned: Timing, default: Timing
         ) -> TunedRow:
    from spectune.db import TunedRow

    return TunedRow(
        device=study.device, software=study.software, kernel=study.item.kernel,
        kernel_hash=study.family.source_hash, problem=study.item.problem, config=config,
        tuned=tuned, default=default, trials=study.trials,
        tuning_seconds=time.monotonic() - study.started, host=socket.gethostname(),
        study=study.study,
    )


def _held(study: _Promotion, store: Store) -> TunedRow | None:
    """The database's row for this very key (same device, Triton, kernel source and
    problem): the nearest row, when it is at distance 0."""
    near = store.best_configs_near(
        kernel=study.item.kernel, device=study.device, problem=study.item.problem,
        triton=study.software.triton, kernel_hash=study.family.source_hash, limit=1,
    )
    return near[0] if near and near[0].problem == study.item.problem else None


def _against_vllm(
    study: _Promotion, *, store: Store, default_config: dict[str, int],
    default_t: Timing | None, promoted: str,
) -> tuple[VllmComparison | None, Timing | None, str]:
    """Measure the config serving the shape beside vLLM's own function and record the
    verdict (see the module docstring, step 6).

    Returns:
        The comparison (``None`` when vLLM is not installed), the serving config's
        timing in it, and the sweep's verdict on the database (``default row`` when a
        row with the default config was written to hold the comparison).
    """
    from dataclasses import replace

    from spectune.tuning._vs_vllm import compare_with_vllm, vllm_unavailable

    missing = vllm_unavailable()
    if missing is not None:
        if not _SAID_NO_VLLM:
            _SAID_NO_VLLM.append(missing)
            logger.warning("spectune: %s: the verdicts against vLLM need vLLM; rows "
                           "are recorded as not measured against it", missing)
        return None, None, promoted
    held = _held(study, store)
    if (held is not None and promoted in ("up to date", "kept")
            and held.vllm.verdict != "not measured"
            and held.vllm.version == _installed_vllm_version()):
        # Its verdict stands: measured under this vLLM, and the row is unchanged.
        return held.vllm, held.tuned, promoted
    config = default_config if held is None else held.config
    measured = compare_with_vllm(family=study.family, inputs=study.runner.inputs,
                                 config=config, timer=study.runner.timer)
    comparison = measured.comparison
    if held is not None:
        store.set_vllm_comparison(held.key, comparison)
    elif comparison.verdict != "not measured":
        # The default serves this shape: a row holds its verdict (the plugin routes a
        # shape only where a row says spectune is faster).
        timing = measured.ours or default_t
        assert timing is not None
        row = replace(_row(study, default_config, tuned=timing, default=timing),
                      vllm=comparison)
        store.record(row, spaces=family_space)
        promoted = "default row"
    return comparison, measured.ours, promoted


def _installed_vllm_version() -> str | None:
    from spectune.vllm import installed_vllm_version

    return installed_vllm_version()


#: Said once per process: a sweep without vLLM.
_SAID_NO_VLLM: list[str] = []


def _supersede(
    study: _Promotion, *, store: Store, held: TunedRow, best_config: dict[str, int],
    default_config: dict[str, int], timer: Callable[[dict[str, int]], Timing],
) -> tuple[str, Timing | None, Timing | None]:
    """Replace a row that no longer describes this system by the study's best, measured
    side by side with the default; remove it when the default is as fast."""
    if best_config == default_config:
        default_t = timer(default_config)
        store.remove(held.key)
        return "removed", default_t, default_t
    decision = decide_side_by_side(lambda: timer(best_config), lambda: timer(default_config))
    if not decision.faster:
        store.remove(held.key)
        return "removed", decision.incumbent, decision.candidate
    row = _row(study, best_config, tuned=decision.candidate, default=decision.incumbent)
    outcome = store.record(row, spaces=family_space, supersede=True)
    return outcome.value, decision.incumbent, decision.candidate


# How long the main process waits for its worker processes to be ready (imports).
_WORKER_START_TIMEOUT = 120.0


def transfer_prior(
    store: Store, *, item: SweepItem, device: DeviceIdentity, software: SoftwareIdentity,
    kernel_hash: str,
) -> list[dict[str, int]]:
    """What the database already knows for this study: its prior, best guess first.

    The best configs of this kernel (same source) for the nearest problems on this
    device and Triton version, then those other GPU models found (nearest problem
    first, the same backend and architecture first; any Triton version). The study's
    :class:`~spectune.search.TransferStrategy` tries them on alternate turns and drops
    them once they stop improving; a config outside this device's space is passed over.
    """
    own = store.best_configs_near(kernel=item.kernel, device=device, problem=item.problem,
                                  triton=software.triton, kernel_hash=kernel_hash)
    others = store.best_configs_near(kernel=item.kernel, device=device, problem=item.problem,
                                     kernel_hash=kernel_hash, other_devices=True)
    prior: list[dict[str, int]] = []
    for row in (*own, *others):
        if row.config not in prior:
            prior.append(dict(row.config))
    return prior


def _sampler(options: SweepOptions, seed: int, prior: Sequence[dict[str, int]]
             ) -> str | Strategy:
    if not prior or not isinstance(options.sampler, str):
        return options.sampler
    return TransferStrategy(make_strategy(options.sampler, seed=seed), prior=prior)


def _isolates(options: SweepOptions, backend: str) -> bool:
    from spectune.identity import CPU_BACKEND

    return backend != CPU_BACKEND if options.isolate is None else options.isolate


@contextmanager
def _objective(family: KernelFamily, item: SweepItem, backend: str, options: SweepOptions,
               isolate: bool) -> Iterator[TrialRunner | IsolatedRunner]:
    """The study's objective: trials in this process, or in an isolated worker (closed
    after the study; a worker that cannot be restarted ends the study with one line)."""
    if not isolate:
        yield TrialRunner(family=family, problem=item.problem, backend=backend,
                          seed=options.seed, time_limit=options.trial_time_limit)
        return
    with IsolatedRunner(family=family, problem=item.problem, backend=backend,
                        seed=options.seed, time_limit=options.trial_time_limit) as runner:
        try:
            yield runner
        except TrialWorkerLost as exc:
            # The interrupted trial is retried first when the study resumes.
            cause = exc.__cause__ or exc
            raise WorkerStartError(f"the study stopped: {one_line(cause)}") from exc


def _start_helpers(
    item: SweepItem, options: SweepOptions, storage: str, name: str,
    warm: list[dict[str, int]], prior: list[dict[str, int]], *, count: int,
    isolate: bool = False,
) -> list[multiprocessing.Process]:
    """Worker processes that share the study through ``storage`` (``--workers N``).

    Returns once each is ready to evaluate (or has died), so all start together.
    """
    ctx = multiprocessing.get_context("spawn")
    procs, events = [], []
    for index in range(1, count + 1):
        ready = ctx.Event()
        proc = ctx.Process(
            target=_helper_main,
            args=(item, options, storage, name, warm, prior, index, ready, isolate),
            # A daemon process may not start children: isolated helpers start their
            # trial workers, so they are joined (or interrupted with the sweep) instead.
            daemon=not isolate,
        )
        proc.start()
        procs.append(proc)
        events.append(ready)
    deadline = time.monotonic() + _WORKER_START_TIMEOUT
    for proc, ready in zip(procs, events, strict=True):
        while not ready.wait(0.2) and proc.is_alive() and time.monotonic() < deadline:
            pass
    return procs


def _helper_main(
    item: SweepItem, options: SweepOptions, storage: str, name: str,
    warm: list[dict[str, int]], prior: list[dict[str, int]], index: int, ready: object,
    isolate: bool = False,
) -> None:
    device = detect_device()
    family = get_family(item.kernel)
    seed = options.seed + _WORKER_SEED_STRIDE * index + os.getpid() % _WORKER_SEED_STRIDE
    with _objective(family, item, device.backend, options, isolate) as objective:
        ready.set()  # type: ignore[attr-defined]
        search(
            objective, space=family.search_space(device.backend), max_evals=options.trials,
            time_budget=options.time_budget, patience=options.patience, warm_start=warm,
            sampler=_sampler(options, seed, prior), seed=seed,
            storage=storage, study_name=name,
        )
