"""A sweep: one correctness-gated study per problem, promoted into the configs database.

For each (kernel, k, batch, vocab, dtype, draft probs) on the current device:

1. open (or resume) the problem's Optuna study in ``storage``;
2. warm-start it with the kernel's default config and the best configs of neighbouring
   problems from the database;
3. run trials (compile -> gate against the reference -> time) until a stop condition;
4. re-measure the best config and the default side by side and promote the best into
   the database only when it is faster by the promotion rule (>= 3% at p50 and
   non-overlapping p20-p80 ranges); the row carries its provenance.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spectune.autotune._engine import Search, SearchObserver, search
from spectune.autotune.problems import SweepItem, study_name
from spectune.autotune.trial import TrialRunner
from spectune.identity import DeviceIdentity, SoftwareIdentity, detect_device, detect_software
from spectune.kernels import family_space, get_family
from spectune.promotion import Timing, is_significantly_faster

__all__ = ["SweepOptions", "SweepResult", "default_storage", "run_item"]


@dataclass(frozen=True)
class SweepOptions:
    """Limits and places of a sweep (see ``spectune sweep --help``)."""

    trials: int | None = 30
    time_budget: float | None = None
    patience: int | None = None
    db: str | None = None
    storage: str | None = None
    workers: int = 1
    sampler: str = "auto"
    seed: int = 0
    trial_time_limit: float | None = 300.0


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
    promoted: str  # inserted | replaced | kept | unchanged | not faster | no result
    seconds: float

    @property
    def speedup(self) -> float | None:
        if self.default is None or self.best is None:
            return None
        return self.default.p50 / self.best.p50


def default_storage() -> Path:
    """Where studies live by default: a journal file next to the user database."""
    from spectune.db import user_db_path

    return user_db_path().parent / "studies.journal"


def run_item(
    item: SweepItem,
    *,
    options: SweepOptions,
    observers: Sequence[SearchObserver] = (),
    device: DeviceIdentity | None = None,
    software: SoftwareIdentity | None = None,
) -> SweepResult:
    """Tune one problem and promote its best config; see the module docstring."""
    from spectune.db import TunedRow, open_store

    started = time.monotonic()
    device = device or detect_device()
    software = software or detect_software()
    family = get_family(item.kernel)
    space = family.search_space(device.backend)
    storage = str(options.storage or default_storage())
    name = study_name(device, item, family.source_hash)
    store = open_store(options.db)
    try:
        default_config = family.default_config(item.problem, device.backend)
        neighbours = store.best_configs_near(
            kernel=item.kernel, device=device, problem=item.problem,
            triton=software.triton, kernel_hash=family.source_hash,
        )
        warm = [default_config, *(row.config for row in neighbours)]
        runner = TrialRunner(family=family, problem=item.problem, backend=device.backend,
                             seed=options.seed, time_limit=options.trial_time_limit)
        helpers = _start_helpers(item, options, storage, name, warm, count=options.workers - 1)
        try:
            result = search(
                runner, space=space, max_evals=options.trials,
                time_budget=options.time_budget, patience=options.patience,
                warm_start=warm, sampler=options.sampler, seed=options.seed,
                storage=storage, study_name=name, observers=observers,
            )
        finally:
            for proc in helpers:
                proc.join()
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
        if best_config is not None:
            # Side by side, in one run: the figures promotion compares and the row keeps.
            default_t = runner.timer(lambda: family.launch(runner.inputs, default_config))
            best_t = runner.timer(lambda: family.launch(runner.inputs, best_config))
            if best_config == default_config:
                promoted = "default is best"
            elif not is_significantly_faster(best_t, default_t):
                promoted = "not faster"
            else:
                row = TunedRow(
                    device=device, software=software, kernel=item.kernel,
                    kernel_hash=family.source_hash, problem=item.problem,
                    config=best_config, tuned=best_t, default=default_t,
                    trials=len(history), tuning_seconds=time.monotonic() - started,
                    host=socket.gethostname(), study=name,
                )
                promoted = store.record(row, spaces=family_space).value
        return SweepResult(
            item=item, study=name, default_config=default_config, default=default_t,
            best_config=best_config, best=best_t, trials=len(history), failed=failed,
            invalid=invalid, stop_reason=result.stop_reason, promoted=promoted,
            seconds=time.monotonic() - started,
        )
    finally:
        store.close()


# How long the main process waits for its worker processes to be ready (imports).
_WORKER_START_TIMEOUT = 120.0


def _start_helpers(
    item: SweepItem, options: SweepOptions, storage: str, name: str,
    warm: list[dict[str, int]], *, count: int,
) -> list[multiprocessing.Process]:
    """Worker processes that share the study through ``storage`` (``--workers N``).

    Returns once each is ready to evaluate (or has died), so all start together.
    """
    ctx = multiprocessing.get_context("spawn")
    procs, events = [], []
    for index in range(1, count + 1):
        ready = ctx.Event()
        proc = ctx.Process(
            target=_helper_main, args=(item, options, storage, name, warm, index, ready),
            daemon=True,
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
    warm: list[dict[str, int]], index: int, ready: object,
) -> None:
    device = detect_device()
    family = get_family(item.kernel)
    runner = TrialRunner(family=family, problem=item.problem, backend=device.backend,
                         seed=options.seed, time_limit=options.trial_time_limit)
    ready.set()  # type: ignore[attr-defined]
    search(
        runner, space=family.search_space(device.backend), max_evals=options.trials,
        time_budget=options.time_budget, patience=options.patience, warm_start=warm,
        sampler=options.sampler, seed=options.seed + 1000 * index + os.getpid() % 1000,
        storage=storage, study_name=name,
    )
