"""A night of tuning: find what needs work in each database, do it within the budget.

For each database of a job (:class:`~spectune.tuning._job.NightlyJob`), on this device:

1. **plan** (:func:`plan_night`): for every shape of the job,

   - ``tune`` it when the database has no row for it (``missing``) or only rows of
     another Triton version or kernel source, or a row measured under another torch,
     GPU runtime or driver, or whose config the search space no longer holds
     (``stale``, with what changed);
   - ``retune`` it when an earlier night found its row regressed or broken and nothing
     has fixed it since;
   - else ``recheck`` it: the tuned config is gated against the reference and timed
     against the default side by side (interleaved, same inputs). It has **regressed**
     when it is no longer faster than the default by the promotion rule, or slower than
     its recorded p50 by more than the measured noise (:func:`slowdown`); **broken**
     when it no longer gives the exact result. Either queues a re-tune for the same night.
     A row whose verdict against vLLM was not measured under the installed vLLM (a vLLM
     upgrade makes every verdict stale) is re-checked even when the job does not
     re-check, and its config measured again beside vLLM's own function
     (:func:`spectune.tuning.compare_with_vllm`); the plugin routes its shape only once
     that says faster.

   Work is ordered missing and stale first, then regressions, then re-checks, oldest
   re-check first (so a night cut short is continued by the next one);
2. **run** it while the budget lasts (:func:`run_night`): studies are resumed where the
   last night stopped them (their storage keeps every finished trial); a stale or
   regressed row is re-tuned in a fresh study and superseded (or removed when the
   default is as fast); every result is recorded in the database's nightly history as it
   is made (the nightly history of :mod:`spectune.db`), so a night cut short keeps what it did.

A night needs a person (exit status 1 of ``spectune nightly``) when a regression or a
broken config is left unfixed, or a shape failed (no valid config, an error).
"""

from __future__ import annotations

import hashlib
import logging
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from spectune.identity import DeviceIdentity, SoftwareIdentity
from spectune.messages import one_line
from spectune.promotion import MIN_GAIN, SideBySide, Timing, decide_side_by_side
from spectune.tuning._job import NightlyJob, ShapeGroup
from spectune.tuning.problems import SweepItem, as_looked_up, sweep_items

if TYPE_CHECKING:
    from spectune.db import NightlyResult, NightlyRun, Store, TunedRow, VllmComparison
    from spectune.tuning._vs_vllm import VsVllm

_log = logging.getLogger(__name__)

__all__ = ["NightInterrupted", "NightReport", "Work", "plan_night", "run_night", "slowdown"]

#: Verdicts of results that leave work for a person (or a later night's re-tune).
NEEDS_PERSON = ("regressed", "broken", "failed")
#: Verdicts of tunes that fix a regression: a row holds a config that was measured
#: tonight, or the row is gone and the default serves.
_FIXED = ("inserted", "replaced", "kept", "unchanged", "up to date", "removed",
          "default is best", "not faster")
_RANKS = {"missing": 0, "stale": 1, "regressed": 2, "broken": 2, "recheck": 3}


class NightInterrupted(KeyboardInterrupt):
    """A night stopped by Ctrl-C or SIGTERM, closed as ``interrupted``; carries what it
    did (:attr:`report`) for the report."""

    def __init__(self, report: NightReport) -> None:
        super().__init__("the night was interrupted")
        self.report = report


@dataclass(frozen=True)
class Work:
    """One shape's work tonight.

    Attributes:
        action: ``tune``, ``retune`` or ``recheck``.
        item: The kernel and problem.
        why: ``missing``, ``stale``, ``regressed``, ``broken`` or ``recheck``.
        reason: What a person reads: what changed, when it regressed.
        group: The job's shape group (its limits).
        row: The database's row the work is about (re-checked or superseded).
        since: For re-checks, when the row was last checked (or tuned): oldest first.
        study_suffix: A fresh study for re-tunes (a stable name, so the next night
            resumes it).
    """

    action: str
    item: SweepItem
    why: str
    reason: str
    group: ShapeGroup
    row: TunedRow | None = None
    since: datetime | None = None
    study_suffix: str = ""

    @property
    def rank(self) -> int:
        return _RANKS[self.why]


@dataclass
class NightReport:
    """What a night did, for the report and the exit status."""

    job: str
    database: str
    device: DeviceIdentity
    software: SoftwareIdentity
    driver: str
    budget: float
    started: datetime
    run: NightlyRun | None = None
    results: list[NightlyResult] = field(default_factory=list)
    deferred: list[Work] = field(default_factory=list)
    planned: list[Work] = field(default_factory=list)
    status: str = "running"
    seconds: float = 0.0
    error: str = ""

    @property
    def needs_person(self) -> list[NightlyResult]:
        """Results a person must look at: failures, and regressions or broken configs
        no re-tune fixed tonight."""
        fixed = {(r.kernel, r.problem) for r in self.results
                 if r.action in ("tune", "retune") and r.verdict in _FIXED}
        return [r for r in self.results if r.verdict in NEEDS_PERSON
                and not (r.action == "recheck" and (r.kernel, r.problem) in fixed)]

    def counts(self) -> dict[str, int]:
        """Summary counts (stored with the night)."""
        out: dict[str, int] = {"planned": len(self.planned), "done": len(self.results),
                               "deferred": len(self.deferred),
                               "needs_person": len(self.needs_person)}
        for r in self.results:
            out[f"{r.action}:{r.verdict}"] = out.get(f"{r.action}:{r.verdict}", 0) + 1
        return out


def plan_night(
    job: NightlyJob, *, store: Store | None, device: DeviceIdentity, software: SoftwareIdentity,
    driver: str, shard: tuple[int, int] = (0, 1),
) -> list[Work]:
    """The work tonight for one database, in the order it is done (see the module).

    Args:
        job: The job.
        store: The database (only read); ``None`` for one that does not exist yet.
        device: This device.
        software: This software.
        driver: This driver (:func:`spectune.identity.detect_driver`).
        shard: ``(index, count)``: only the shapes of this shard (many GPUs of one model
            sharing a job: each takes the shapes whose stable hash falls in its shard).
    """
    from spectune.kernels import get_family

    history = [] if store is None else _history(store, device)
    driver_since = None if store is None else _driver_since(store, device, driver)
    settled = set() if store is None else _default_is_best(store, device, history,
                                                           software=software, driver=driver)
    latest = _latest_by_shape(history)
    rows_of: dict[str, list[TunedRow]] = {}
    work: list[Work] = []
    for group, item in _items(job):
        if not _in_shard(item, shard):
            continue
        family = get_family(item.kernel)
        if store is None:
            rows_of[item.kernel] = []
        elif item.kernel not in rows_of:
            rows_of[item.kernel] = [
                r for r in store.rows(kernel=item.kernel, device_name=device.device_name,
                                      on_bad_row=_log_bad_row)
                if r.device == device
            ]
        rows = [r for r in rows_of[item.kernel] if r.problem == item.problem]
        current = next((r for r in rows if r.software.triton == software.triton
                        and r.kernel_hash == family.source_hash), None)
        if current is None:
            if (item.kernel, family.source_hash, item.problem) in settled:
                continue  # the default won on this very system: nothing to tune until it changes
            if rows:
                newest = max(rows, key=lambda r: r.tuned_at)
                changes = _changes(newest, software=software, kernel_hash=family.source_hash)
                work.append(Work("tune", item, "stale", "stale: " + "; ".join(changes), group,
                                 study_suffix=_env_suffix(software, driver)))
            else:
                work.append(Work("tune", item, "missing", "missing", group))
            continue
        changes = _changes(current, software=software, kernel_hash=family.source_hash)
        space = family.search_space(device.backend)
        if not space.is_valid(current.config):
            changes.append("search space no longer holds its config")
        if driver_since is not None and current.tuned_at < driver_since[0]:
            changes.append(f"driver {driver_since[1]} -> {driver}")
        if changes:
            work.append(Work("tune", item, "stale", "stale: " + "; ".join(changes), group,
                             row=current, study_suffix=_env_suffix(software, driver)))
            continue
        last = latest.get((item.kernel, item.problem))
        open_problem = _open_regression(history, item)
        if open_problem is not None and open_problem.finished_at is not None \
                and open_problem.finished_at > current.tuned_at:
            when = open_problem.finished_at.strftime("%Y-%m-%d")
            work.append(Work(
                "retune", item, open_problem.verdict,
                f"{open_problem.verdict} on {when}: {open_problem.message}", group,
                row=current, study_suffix=f"~retune-{open_problem.finished_at:%Y%m%d%H%M%S}",
            ))
            continue
        versus = _vllm_verdict_stale(current)
        if job.recheck or versus:
            since = current.tuned_at
            if last is not None and last.finished_at is not None and last.finished_at > since:
                since = last.finished_at
            reason = f"recheck: last measured {since:%Y-%m-%d %H:%M} UTC"
            work.append(Work("recheck", item, "recheck",
                             f"{reason}; {versus}" if versus else reason, group,
                             row=current, since=since))
    # Stable: within a rank, the job's order; re-checks oldest first.
    return sorted(work, key=lambda w: (w.rank, w.since.timestamp() if w.since else 0.0))


def run_night(
    job: NightlyJob, *, database: str, storage: str, device: DeviceIdentity,
    software: SoftwareIdentity, driver: str, budget: float | None = None,
    shard: tuple[int, int] = (0, 1), isolate: bool = False,
    on_work: Callable[[Work, int, int], None] | None = None,
    on_result: Callable[[NightlyResult], None] | None = None,
) -> NightReport:
    """Plan and run one database's night (see the module).

    Args:
        job: The job.
        database: The database (URL or path).
        storage: Where the studies live.
        device: This device.
        software: This software.
        driver: This driver.
        budget: Seconds for this database (default: the job's budget).
        shard: ``(index, count)``, see :func:`plan_night`.
        isolate: Run trials in a child process with a watchdog.
        on_work: Told of each piece of work as it starts (its position, the total).
        on_result: Told of each result as it is recorded.

    Returns:
        The :class:`NightReport`.

    Raises:
        NightInterrupted: Ctrl-C or SIGTERM (a ``KeyboardInterrupt``), after the run was
            closed as ``interrupted``; it carries the report so far.
    """
    from spectune.db import finish_night, open_store, record_result, start_night

    budget = job.budget if budget is None else budget
    started = time.monotonic()
    report = NightReport(job=job.name, database=database, device=device, software=software,
                         driver=driver, budget=budget, started=_now())
    with open_store(database) as store:
        report.planned = plan_night(job, store=store, device=device, software=software,
                                    driver=driver, shard=shard)
        report.run = start_night(store, job=job.name, host=socket.gethostname(),
                                 device=device, software=software, driver=driver,
                                 budget_seconds=budget)
        queue = list(report.planned)
        status = "complete"
        current: Work | None = None  # started, not recorded
        try:
            position = 0
            while queue:
                work = queue.pop(0)
                left = budget - (time.monotonic() - started)
                if left <= 0:
                    report.deferred = [work, *queue]
                    status = "budget"
                    break
                position += 1
                current = work
                if on_work is not None:
                    on_work(work, position, position + len(queue))
                result = _do(work, job=job, store=store, database=database, storage=storage,
                             device=device, software=software, left=left, isolate=isolate)
                record_result(store, report.run.id, result)
                report.results.append(result)
                current = None
                if on_result is not None:
                    on_result(result)
                if work.action == "recheck" and result.verdict in ("regressed", "broken"):
                    # Fixed tonight when the budget allows, else first thing next night.
                    queue.append(replace(
                        work, action="retune", why=result.verdict,
                        reason=f"{result.verdict} tonight: {result.message}",
                        study_suffix=f"~retune-{_now():%Y%m%d%H%M%S}"))
        except KeyboardInterrupt as exc:
            report.status = "interrupted"
            report.seconds = time.monotonic() - started
            report.deferred = [*([current] if current is not None else []), *queue]
            finish_night(store, report.run.id, status="interrupted", summary=report.counts())
            raise NightInterrupted(report) from exc
        report.status = status
        report.seconds = time.monotonic() - started
        finish_night(store, report.run.id, status=status, summary=report.counts())
    return report


def _do(
    work: Work, *, job: NightlyJob, store: Store, database: str, storage: str,
    device: DeviceIdentity, software: SoftwareIdentity, left: float, isolate: bool,
) -> NightlyResult:
    """Do one piece of work; any error becomes a ``failed`` result naming it."""
    from spectune.db import NightlyResult
    from spectune.kernels import get_family

    started = time.monotonic()
    family = get_family(work.item.kernel)
    base = dict(kernel=work.item.kernel, kernel_hash=family.source_hash,
                problem=work.item.problem, action=work.action, reason=work.reason)
    try:
        if work.action == "recheck":
            assert work.row is not None
            outcome = _recheck(work, device=device, seed=job.seed, store=store)
        else:
            outcome = _tune(work, job=job, database=database, storage=storage,
                            device=device, software=software, left=left, isolate=isolate)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        outcome = dict(verdict="failed", message=f"{type(exc).__name__}: {one_line(exc)}")
    return NightlyResult(**base, **outcome, seconds=time.monotonic() - started)


def _tune(
    work: Work, *, job: NightlyJob, database: str, storage: str, device: DeviceIdentity,
    software: SoftwareIdentity, left: float, isolate: bool,
) -> dict[str, Any]:
    from spectune.tuning.sweep import SweepOptions, run_item

    group = work.group
    time_budget = left if group.time_budget is None else min(group.time_budget, left)
    options = SweepOptions(trials=group.trials, time_budget=time_budget,
                           patience=group.patience, db=database, storage=storage,
                           workers=job.workers, sampler=job.sampler, seed=job.seed,
                           **({"isolate": True} if isolate else {}))
    result = run_item(work.item, options=options, device=device, software=software,
                      study_suffix=work.study_suffix, supersede=work.row is not None)
    if result.best_config is None:
        verdict, message = "failed", (
            f"no valid config in {result.trials} evaluations ({result.failed} failed, "
            f"{result.invalid} invalid)")
    else:
        verdict, message = result.promoted, f"study {result.study}: {result.stop_reason}"
    return dict(verdict=verdict, message=message, config=result.best_config,
                tuned=result.best, default=result.default, evaluations=result.trials,
                evaluations_to_best=result.best_evaluation,
                recorded_p50=None if work.row is None else work.row.tuned.p50,
                **_vs_vllm_fields(result.vllm, result.served))


def _recheck(work: Work, *, device: DeviceIdentity, seed: int, store: Store | None = None
             ) -> dict[str, Any]:
    """Gate the tuned config, then time it against the default side by side; measure it
    again beside vLLM's own function when its verdict is stale (recorded in ``store``)."""
    from spectune.kernels import get_family
    from spectune.search import Status
    from spectune.tuning.trial import TrialRunner

    row = work.row
    assert row is not None
    family = get_family(work.item.kernel)
    runner = TrialRunner(family=family, problem=work.item.problem, backend=device.backend,
                         seed=seed)
    config = dict(row.config)
    default = family.default_config(work.item.problem, device.backend)
    gate = runner(config)
    # The row's recorded comparison with vLLM, unless measured again below.
    base: dict[str, Any] = dict(config=config, recorded_p50=row.tuned.p50,
                                **_vs_vllm_fields(row.vllm, row.tuned))
    if gate.status is not Status.OK:
        return dict(base, verdict="broken",
                    message=f"tuned config {gate.status.value}: {gate.message}")

    if config == default and row.vllm.version is not None:
        # A row holding the default to hold the verdict against vLLM of a shape no tuned
        # config beat (a sweep writes one only once vLLM was measured): nothing to
        # compare it with but vLLM. (Any other row holding the default has regressed.)
        message = "the default config serves this shape"
        if store is not None and _vllm_verdict_stale(row):
            found, measured = _measure_against_vllm(row, store=store, runner=runner)
            message += "; " + found
            base.update(_vs_vllm_fields(measured.comparison, measured.ours))
        return dict(base, verdict="ok", message=message)

    def timer(c: dict[str, int]) -> Callable[[], Timing]:
        return lambda: runner.timer(lambda: family.launch(runner.inputs, c))

    # A regression sends a row to a re-tune and a person to the report: one that shows
    # is measured once more, side by side again, and stands only if it shows again.
    for _ in range(2):
        decision = decide_side_by_side(timer(config), timer(default))
        problems = _regressions(row, decision)
        if not problems:
            break
    base.update(tuned=decision.candidate, default=decision.incumbent)
    if problems:
        return dict(base, verdict="regressed",
                    message="; ".join(problems) + " (in two measurements)")
    message = (f"{decision.incumbent.p50 / decision.candidate.p50:.2f}x over the default "
               f"({decision.rounds} rounds)")
    if store is not None and _vllm_verdict_stale(row):
        found, measured = _measure_against_vllm(row, store=store, runner=runner)
        message += "; " + found
        base.update(_vs_vllm_fields(measured.comparison, measured.ours))
    return dict(base, verdict="ok", message=message)


def _vs_vllm_fields(comparison: VllmComparison | None, served: Timing | None
                    ) -> dict[str, Any]:
    """A night's result's fields for a comparison with vLLM (none: not compared) and the
    serving config's timing in it."""
    if comparison is None:
        return {}
    return dict(vs_vllm=comparison.verdict, vllm_p50=comparison.p50_us,
                vllm_version=comparison.version,
                served_p50=None if comparison.p50_us is None or served is None
                else served.p50)


def _vllm_verdict_stale(row: TunedRow) -> str:
    """Why ``row``'s verdict against vLLM needs measuring (empty: it does not): never
    measured, or measured under another vLLM than the installed one. Nothing is stale
    without vLLM installed (nothing to measure it against)."""
    from spectune.vllm import installed_vllm_version

    installed = installed_vllm_version()
    if installed is None:
        return ""
    measured = row.vllm
    if measured.version == installed:
        return ""  # measured, or tried and found not measurable, under this vLLM
    if measured.version is None:
        return f"not measured against vLLM {installed}"
    return f"measured against vLLM {measured.version}, now {installed}"


def _measure_against_vllm(row: TunedRow, *, store: Store, runner: Any
                         ) -> tuple[str, VsVllm]:
    """Measure ``row``'s config beside vLLM's own function and record it.

    Returns:
        What it found, for a person, and the measurement.
    """
    from spectune.kernels import get_family
    from spectune.tuning._vs_vllm import compare_with_vllm

    measured = compare_with_vllm(family=get_family(row.kernel), inputs=runner.inputs,
                                 config=dict(row.config), timer=runner.timer)
    comparison = measured.comparison
    store.set_vllm_comparison(row.key, comparison)
    if comparison.p50_us is not None and measured.ours is not None:
        ratio = comparison.p50_us / measured.ours.p50
        return f"vs vLLM {comparison.version}: {comparison.verdict} ({ratio:.2f}x)", measured
    return f"vs vLLM: not measured ({comparison.reason})", measured


def _regressions(row: TunedRow, decision: SideBySide) -> list[str]:
    """What makes ``row``'s config regressed in ``decision`` (empty: nothing)."""
    problems = []
    if not decision.faster:
        problems.append(
            f"no longer faster than the default by the promotion rule (p50 "
            f"{decision.candidate.p50:.4g} vs {decision.incumbent.p50:.4g} µs, "
            f"{decision.rounds} rounds)")
    slower, noise = slowdown(recorded=row.tuned, now=decision.candidate,
                             recorded_default=row.default, now_default=decision.incumbent)
    if slower > max(MIN_GAIN, noise):
        problems.append(
            f"{slower:.0%} slower than recorded (p50 {decision.candidate.p50:.4g} vs "
            f"{row.tuned.p50:.4g} µs; measured noise {noise:.0%})")
    return problems


def slowdown(*, recorded: Timing, now: Timing, recorded_default: Timing, now_default: Timing
             ) -> tuple[float, float]:
    """How much slower a config runs than recorded, and the noise of that comparison.

    The noise is measured, not assumed: how far the default's median moved between the
    two measurements (the same code on the same device, so any move is the system's:
    clocks, load, another night), plus the spread (p20-p80 over p50) of each of the two
    measurements of the config. Within-run spreads alone understate it: two runs on
    different nights differ by more than the rounds of one run.

    Returns:
        ``(slowdown, noise)``, both relative (0.10 = 10 %); a regression is a slowdown
        past ``max(MIN_GAIN, noise)``.
    """
    drift = abs(now_default.p50 / recorded_default.p50 - 1.0)
    spread = ((now.p80 - now.p20) / now.p50) + ((recorded.p80 - recorded.p20) / recorded.p50)
    return now.p50 / recorded.p50 - 1.0, drift + spread


def _items(job: NightlyJob) -> Iterable[tuple[ShapeGroup, SweepItem]]:
    seen: set[SweepItem] = set()
    for group in job.shapes:
        items = as_looked_up(sweep_items(
            kernels=group.kernels, spec_lens=group.spec_lens, batches=_buckets(group),
            vocabs=group.vocab_sizes, dtypes=group.dtypes, draft_probs=group.draft_probs))
        for item in items:
            if item not in seen:
                seen.add(item)
                yield group, item


def _buckets(group: ShapeGroup) -> list[int]:
    from spectune.db import batch_bucket

    return sorted({batch_bucket(b) for b in group.batch_sizes})


def _in_shard(item: SweepItem, shard: tuple[int, int]) -> bool:
    index, count = shard
    if count == 1:
        return True
    p = item.problem
    text = f"{item.kernel}/{p.spec_len}/{p.batch}/{p.vocab}/{p.dtype}/{p.draft_probs}"
    return int(hashlib.sha256(text.encode()).hexdigest(), 16) % count == index


def _changes(row: TunedRow, *, software: SoftwareIdentity, kernel_hash: str) -> list[str]:
    """What differs between the system a row was measured on and this one."""
    out = []
    for name, was, now in (("triton", row.software.triton, software.triton),
                           ("torch", row.software.torch, software.torch),
                           ("runtime", row.software.runtime, software.runtime)):
        if was != now:
            out.append(f"{name} {was} -> {now}")
    if row.kernel_hash != kernel_hash:
        out.append(f"kernel source {row.kernel_hash} -> {kernel_hash}")
    return out


def _env_suffix(software: SoftwareIdentity, driver: str) -> str:
    # A fresh study per system: the old study's timings were taken on another one. The
    # same system (next night) resumes it.
    text = f"{software.triton}|{software.torch}|{software.runtime}|{driver}"
    return "~env-" + hashlib.sha256(text.encode()).hexdigest()[:8]


def _history(store: Store, device: DeviceIdentity) -> list[NightlyResult]:
    from spectune.db import night_results

    return night_results(store, device=device)


def _latest_by_shape(history: Sequence[NightlyResult]) -> dict[tuple[str, Any], NightlyResult]:
    out: dict[tuple[str, Any], NightlyResult] = {}
    for r in history:
        out[(r.kernel, r.problem)] = r
    return out


def _open_regression(history: Sequence[NightlyResult], item: SweepItem) -> NightlyResult | None:
    """The latest regression or broken config of ``item`` that no later result fixed."""
    found = None
    for r in history:
        if (r.kernel, r.problem) != (item.kernel, item.problem):
            continue
        if r.action == "recheck" and r.verdict in ("regressed", "broken"):
            found = r
        elif r.verdict in _FIXED or (r.action == "recheck" and r.verdict == "ok"):
            found = None
    return found


def _default_is_best(
    store: Store, device: DeviceIdentity, history: Sequence[NightlyResult], *,
    software: SoftwareIdentity, driver: str,
) -> set[tuple[str, str, Any]]:
    """The (kernel, kernel hash, problem) whose latest tune found nothing faster than the
    default, on a night with this very software and driver: tuning them again would
    find the same (a change of any of them makes them due again)."""
    from spectune.db import nights

    same = {n.id for n in nights(store, device=device)
            if (n.software.triton, n.software.torch, n.software.runtime, n.driver)
            == (software.triton, software.torch, software.runtime, driver)}
    latest: dict[tuple[str, str, Any], NightlyResult] = {}
    for r in history:
        if r.action != "recheck":
            latest[(r.kernel, r.kernel_hash, r.problem)] = r
    return {key for key, r in latest.items() if r.run_id in same
            and r.verdict in ("default is best", "not faster", "removed")}


def _log_bad_row(error: Exception) -> None:
    # Planning goes on without a row edited by hand into nonsense; it is named.
    _log.warning("spectune nightly: skipped %s", error)


def _driver_since(store: Store, device: DeviceIdentity, driver: str
                  ) -> tuple[datetime, str] | None:
    """When this device's nights first saw ``driver`` after another one, and the one
    before; ``None`` when no night saw another (rows need no re-tune for it)."""
    from spectune.db import nights

    previous = None
    since = None
    for night in nights(store, device=device):
        if night.driver != driver:
            previous, since = night.driver, None
        elif since is None:
            since = night.started_at
    if previous is None:
        return None
    return (since or _now()), previous


def _now() -> datetime:
    from spectune.db import utc_now

    return utc_now()
