"""The nightly history: every night's run and what it found for each shape.

``spectune nightly`` opens a run (:func:`start_night`), records one
:class:`NightlyResult` per shape it tuned, re-tuned or re-checked as it goes (a night cut
short keeps what it finished), and closes the run with its status. Reports and the next
night read it back (:func:`nights`, :func:`night_results`): which rows were re-checked
longest ago, which regressions are still open, how each shape's speedup moved across
nights, how each shape compared with vLLM's own function. Tables of schema revision
0003 (0004 added the comparison with vLLM); written and read through SQLAlchemy, as only
the tuner uses them (serving never does).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from spectune.db._fields import VS_VLLM_VERDICTS
from spectune.db._row import utc_now
from spectune.db.errors import DatabaseError
from spectune.identity import DeviceIdentity, SoftwareIdentity
from spectune.promotion import Timing
from spectune.space import Problem

if TYPE_CHECKING:
    from spectune.db._store import Store

__all__ = [
    "ACTIONS",
    "RUN_STATUSES",
    "NightlyResult",
    "NightlyRun",
    "finish_night",
    "has_history",
    "night_results",
    "nights",
    "record_result",
    "start_night",
]

#: What a night does to a shape: tune it (no usable row, or a stale one), re-tune it (a
#: regression), re-check it (time the tuned config against the default side by side).
ACTIONS = ("tune", "retune", "recheck")
#: How a night ended.
RUN_STATUSES = ("running", "complete", "budget", "interrupted", "failed")
# Text columns are cut to their size rather than refused: a message is for people.
_TEXT = 1024


@dataclass(frozen=True)
class NightlyRun:
    """One night of one job on one device."""

    id: int
    job: str
    host: str
    device: DeviceIdentity
    software: SoftwareIdentity
    driver: str
    budget_seconds: float
    started_at: datetime
    finished_at: datetime | None
    status: str
    summary: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NightlyResult:
    """What a night did for one shape, and the verdict.

    Attributes:
        kernel: Kernel family.
        kernel_hash: Its source hash that night.
        problem: The shape.
        action: One of :data:`ACTIONS`.
        reason: Why it was done (``missing``, ``stale: triton 3.1.0 -> 3.2.0``, ...).
        verdict: What came of it: for tunes the database's verdict (``inserted``,
            ``replaced``, ``default is best``, ...) or ``failed``; for re-checks ``ok``,
            ``regressed`` or ``broken`` (the tuned config no longer gives exact results).
        config: The config measured (the tuned one, or the study's best).
        tuned: Its timing that night.
        default: The default config's timing, measured side by side.
        recorded_p50: The tuned p50 the row held before (re-checks).
        evaluations: Evaluations in the study (tunes).
        evaluations_to_best: At which evaluation the study found its best (tunes).
        seconds: Wall time spent on the shape.
        message: Details for a person (the failure, what was compared).
        vs_vllm: The verdict against vLLM's own function (one of
            :data:`spectune.db.VS_VLLM_VERDICTS`) of the config serving the shape after
            the work: measured tonight, or the row's recorded one; ``None`` when there is
            none (vLLM not installed, the work failed, a night before revision 0004).
        vllm_p50: vLLM's function's median in that comparison, µs.
        vllm_version: The vLLM version it was measured under.
        served_p50: The serving config's median in the same comparison, µs.
        run_id: The night it belongs to (set when read back).
        finished_at: When it was recorded.
    """

    kernel: str
    kernel_hash: str
    problem: Problem
    action: str
    reason: str
    verdict: str
    config: Mapping[str, int] | None = None
    tuned: Timing | None = None
    default: Timing | None = None
    recorded_p50: float | None = None
    evaluations: int | None = None
    evaluations_to_best: int | None = None
    seconds: float = 0.0
    message: str = ""
    vs_vllm: str | None = None
    vllm_p50: float | None = None
    vllm_version: str | None = None
    served_p50: float | None = None
    run_id: int | None = None
    finished_at: datetime | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {self.action!r}")
        if self.vs_vllm is not None and self.vs_vllm not in VS_VLLM_VERDICTS:
            raise ValueError(f"vs_vllm must be one of {VS_VLLM_VERDICTS} or None, "
                             f"got {self.vs_vllm!r}")

    @property
    def vs_vllm_ratio(self) -> float | None:
        """vLLM's median over the serving config's (above 1: spectune is faster), when
        both were measured side by side."""
        if self.vllm_p50 is None or self.served_p50 is None or self.served_p50 <= 0:
            return None
        return self.vllm_p50 / self.served_p50

    @property
    def speedup(self) -> float | None:
        """The default's p50 over the tuned config's, when both were measured."""
        if self.tuned is None or self.default is None or self.tuned.p50 <= 0:
            return None
        return self.default.p50 / self.tuned.p50


def start_night(
    store: Store, *, job: str, host: str, device: DeviceIdentity, software: SoftwareIdentity,
    driver: str, budget_seconds: float,
) -> NightlyRun:
    """Open a night's run (status ``running``) and return it with its id."""
    from spectune.db._models import NightlyRunRecord

    started = utc_now()
    values = dict(
        job=_cut(job, 128), host=_cut(host, 256), **device.as_dict(),
        triton_version=software.triton, torch_version=software.torch,
        runtime_version=software.runtime, driver_version=_cut(driver, 128),
        spectune_version=software.spectune, budget_seconds=float(budget_seconds),
        started_at=started, finished_at=None, status="running", summary={},
    )
    with _session(store) as session:
        record = NightlyRunRecord(**values)
        session.add(record)
        session.flush()
        run_id = int(record.id)
    return NightlyRun(id=run_id, job=job, host=host, device=device, software=software,
                      driver=driver, budget_seconds=float(budget_seconds),
                      started_at=started, finished_at=None, status="running")


def record_result(store: Store, run_id: int, result: NightlyResult) -> None:
    """Add one shape's result to the night ``run_id``."""
    from spectune.db._models import NightlyResultRecord

    p = result.problem
    values: dict[str, Any] = dict(
        run_id=run_id, kernel=result.kernel, kernel_hash=result.kernel_hash,
        spec_len=p.spec_len, batch=p.batch, vocab=p.vocab, dtype=p.dtype,
        draft_probs=p.draft_probs, action=result.action, reason=_cut(result.reason),
        verdict=_cut(result.verdict, 32),
        config=None if result.config is None else dict(result.config),
        recorded_p50_us=_finite(result.recorded_p50), evaluations=result.evaluations,
        evaluations_to_best=result.evaluations_to_best, seconds=float(result.seconds),
        message=_cut(result.message), finished_at=result.finished_at or utc_now(),
        vs_vllm=result.vs_vllm, vllm_p50_us=_finite(result.vllm_p50),
        vllm_version=None if result.vllm_version is None else _cut(result.vllm_version, 128),
        served_p50_us=_finite(result.served_p50),
    )
    for prefix, timing in (("tuned", result.tuned), ("default", result.default)):
        for q in ("p20", "p50", "p80"):
            values[f"{prefix}_{q}_us"] = None if timing is None else _finite(getattr(timing, q))
    with _session(store) as session:
        session.add(NightlyResultRecord(**values))


def finish_night(
    store: Store, run_id: int, *, status: str, summary: Mapping[str, Any]
) -> None:
    """Close the night ``run_id`` with its status and summary counts."""
    from sqlalchemy import update

    from spectune.db._models import NightlyRunRecord

    if status not in RUN_STATUSES:
        raise ValueError(f"status must be one of {RUN_STATUSES}, got {status!r}")
    table = NightlyRunRecord.__table__
    with _session(store) as session:
        session.execute(update(table).where(table.c.id == run_id).values(
            status=status, finished_at=utc_now(), summary=dict(summary)))


def nights(
    store: Store, *, device: DeviceIdentity | None = None, job: str | None = None
) -> list[NightlyRun]:
    """The recorded nights (of one device and job when given), oldest first."""
    from sqlalchemy import select

    from spectune.db._models import NightlyRunRecord

    query = select(NightlyRunRecord).order_by(NightlyRunRecord.started_at, NightlyRunRecord.id)
    if device is not None:
        for name, value in device.as_dict().items():
            query = query.where(getattr(NightlyRunRecord, name) == value)
    if job is not None:
        query = query.where(NightlyRunRecord.job == job)
    if store.readonly and not has_history(store):
        return []
    with _session(store, writes=False) as session:
        return [_run(r) for r in session.scalars(query)]


def night_results(
    store: Store, *, run_ids: Sequence[int] | None = None,
    device: DeviceIdentity | None = None,
) -> list[NightlyResult]:
    """The recorded results of the nights ``run_ids`` (or of every night of ``device``),
    in the order they were recorded."""
    from sqlalchemy import select

    from spectune.db._models import NightlyResultRecord, NightlyRunRecord

    table = NightlyResultRecord.__table__
    names = list(table.c.keys())
    if store.readonly:
        # A read-only store is not upgraded: one of revision 0003 lacks the columns 0004
        # added (they read as None), one older has no history at all.
        present = _history_columns(store)
        if not present:
            return []
        names = [n for n in names if n in present]
    query = select(*(table.c[n] for n in names)).order_by(table.c.id)
    if run_ids is not None:
        query = query.where(table.c.run_id.in_(list(run_ids)))
    if device is not None:
        runs = select(NightlyRunRecord.id)
        for name, value in device.as_dict().items():
            runs = runs.where(getattr(NightlyRunRecord, name) == value)
        query = query.where(table.c.run_id.in_(runs))
    with _session(store, writes=False) as session:
        return [_result(r) for r in session.execute(query)]


def has_history(store: Store) -> bool:
    """Whether ``store`` holds the nightly tables (a database of revision 0003 or later;
    a read-only store of an older one has none, and no history)."""
    return bool(_history_columns(store))


def _history_columns(store: Store) -> frozenset[str]:
    """The columns of ``store``'s ``nightly_results`` (none: it has no such table)."""
    from sqlalchemy import inspect

    from spectune.db._writer import make_engine, translate_errors

    engine = getattr(store, "_engine", None)
    own = engine is None
    if own:
        engine = make_engine(store.url)
    try:
        with translate_errors(store.location):
            inspector = inspect(engine)
            if not inspector.has_table("nightly_results"):
                return frozenset()
            return frozenset(c["name"] for c in inspector.get_columns("nightly_results"))
    finally:
        if own:
            engine.dispose()


class _session:
    """A transaction on ``store``, errors as one-line :class:`DatabaseError`; a read-only
    store is read through an engine of its own (``writes=False``)."""

    def __init__(self, store: Store, *, writes: bool = True) -> None:
        engine = getattr(store, "_engine", None)
        self._own = None
        if engine is None:
            if writes:
                raise DatabaseError(f"{store.location} is open read-only")
            from spectune.db._writer import make_engine

            engine = self._own = make_engine(store.url)
        from sqlalchemy.orm import Session

        from spectune.db._writer import translate_errors

        self._translate = translate_errors(store.location)
        self._session = Session(engine, expire_on_commit=False)

    def __enter__(self) -> Any:
        self._translate.__enter__()
        self._tx = self._session.begin()
        self._tx.__enter__()
        return self._session

    def __exit__(self, *exc: Any) -> None:
        try:
            self._tx.__exit__(*exc)
        finally:
            self._session.close()
            if self._own is not None:
                self._own.dispose()
            self._translate.__exit__(*exc)


def _run(r: Any) -> NightlyRun:
    device = DeviceIdentity(backend=r.backend, arch=r.arch, device_name=r.device_name,
                            cu_count=r.cu_count, warp_size=r.warp_size)
    software = SoftwareIdentity(triton=r.triton_version, torch=r.torch_version,
                                runtime=r.runtime_version, spectune=r.spectune_version)
    return NightlyRun(id=r.id, job=r.job, host=r.host, device=device, software=software,
                      driver=r.driver_version, budget_seconds=r.budget_seconds,
                      started_at=r.started_at, finished_at=r.finished_at, status=r.status,
                      summary=dict(r.summary or {}))


def _timing(r: Any, prefix: str) -> Timing | None:
    values = [getattr(r, f"{prefix}_{q}_us") for q in ("p20", "p50", "p80")]
    if any(v is None for v in values):
        return None
    return Timing(*values)


def _result(r: Any) -> NightlyResult:
    problem = Problem(spec_len=r.spec_len, batch=r.batch, vocab=r.vocab, dtype=r.dtype,
                      draft_probs=bool(r.draft_probs))
    return NightlyResult(
        kernel=r.kernel, kernel_hash=r.kernel_hash, problem=problem, action=r.action,
        reason=r.reason, verdict=r.verdict,
        config=None if r.config is None else {str(k): int(v) for k, v in r.config.items()},
        tuned=_timing(r, "tuned"), default=_timing(r, "default"),
        recorded_p50=r.recorded_p50_us, evaluations=r.evaluations,
        evaluations_to_best=r.evaluations_to_best, seconds=r.seconds, message=r.message,
        # Columns of revision 0004: absent from a read-only database of 0003.
        vs_vllm=getattr(r, "vs_vllm", None), vllm_p50=getattr(r, "vllm_p50_us", None),
        vllm_version=getattr(r, "vllm_version", None),
        served_p50=getattr(r, "served_p50_us", None), run_id=r.run_id,
        finished_at=r.finished_at,
    )


def _cut(text: str, size: int = _TEXT) -> str:
    text = str(text)
    return text if len(text) <= size else text[: size - 1] + "…"


def _finite(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(value)
