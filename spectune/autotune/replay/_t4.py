"""Recorded tuning spaces in the T4 format: read them, and write small ones for tests.

A T4 file (gzip-compressed JSON, see ``shared/tuning-spaces/README.md``) lists every
configuration of a brute-forced space with its outcome. Here it becomes a
:class:`RecordedSpace`: a :class:`~spectune.space.SearchSpace` whose parameter values are
those seen in the file and whose one constraint is membership in the file, plus the
recorded outcome of every member.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.space import Constraint, Param, SearchSpace

__all__ = ["Record", "RecordedSpace", "load_t4", "write_t4"]


@dataclass(frozen=True)
class Record:
    """The recorded outcome of one configuration.

    Attributes:
        ok: Whether the configuration ran and was correct (``invalidity == "correct"``).
        status: The file's ``invalidity`` field (``correct``, ``compile``, ``runtime``...).
        time: Mean recorded time (the file's unit) when ``ok``, else ``None``.
        runtimes: The individual repeated measurements (may be empty).
        compile_time: Recorded compilation time in milliseconds (0 when absent).
    """

    ok: bool
    status: str
    time: float | None
    runtimes: tuple[float, ...]
    compile_time: float


@dataclass(frozen=True)
class RecordedSpace:
    """A fully measured space.

    Attributes:
        name: File stem, for reports.
        space: Parameters (values seen in the file) and the membership constraint.
        records: Recorded outcome of every member, keyed by the tuple of its values in
            ``space.names`` order.
        optimum: Best recorded time among correct configurations.
        decode: For parameters whose file values are not integers, the file value of
            each integer code (the space uses codes 0, 1, ...).
    """

    name: str
    space: SearchSpace
    records: Mapping[tuple[int, ...], Record]
    optimum: float
    decode: Mapping[str, tuple[Any, ...]]

    def key(self, config: Mapping[str, int]) -> tuple[int, ...]:
        """The records key of ``config``."""
        return tuple(config[n] for n in self.space.names)

    def lookup(self, config: Mapping[str, int]) -> Record:
        """The record of ``config``.

        Raises:
            KeyError: ``config`` is not in the file.
        """
        return self.records[self.key(config)]

    def configs(self) -> list[dict[str, int]]:
        """Every recorded configuration, in file order."""
        names = self.space.names
        return [dict(zip(names, key, strict=True)) for key in self.records]


def load_t4(path: str | Path) -> RecordedSpace:
    """Read a T4 file (``.json.gz`` or plain ``.json``).

    Raises:
        ValueError: naming the file, when it holds no results, no correct configuration,
            or results with differing parameter names.
    """
    path = Path(path)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        doc = json.load(fh)
    results = doc.get("results") if isinstance(doc, dict) else None
    if not results:
        raise ValueError(f"{path}: no 'results' in T4 file")
    names = tuple(results[0]["configuration"])
    if any(set(r["configuration"]) != set(names) for r in results):
        raise ValueError(f"{path}: results name different parameters")

    raw_values = {n: {_hashable(r["configuration"][n]) for r in results} for n in names}
    codes: dict[str, dict[Any, int]] = {}
    decode: dict[str, tuple[Any, ...]] = {}
    params = []
    for n in names:
        values = raw_values[n]
        if all(_is_int(v) for v in values):
            ordered = sorted(int(v) for v in values)
            codes[n] = {v: int(v) for v in values}
            if ordered[0] < 0:  # Param values must not be negative: shift to codes
                codes[n] = {v: ordered.index(int(v)) for v in values}
                decode[n] = tuple(ordered)
                ordered = list(range(len(ordered)))
        else:
            ordered_raw = sorted(values, key=_sort_key)
            codes[n] = {v: i for i, v in enumerate(ordered_raw)}
            decode[n] = tuple(ordered_raw)
            ordered = list(range(len(ordered_raw)))
        params.append(Param(name=n, values=tuple(ordered)))

    records: dict[tuple[int, ...], Record] = {}
    for r in results:
        cfg = r["configuration"]
        key = tuple(codes[n][_hashable(cfg[n])] for n in names)
        records[key] = _record(r)
    correct = [rec.time for rec in records.values() if rec.ok and rec.time is not None]
    if not correct:
        raise ValueError(f"{path}: no correct configuration in T4 file")

    members = frozenset(records)
    space = SearchSpace(
        params=tuple(params),
        constraints=(
            Constraint(
                description=f"configuration recorded in {path.name}",
                check=lambda c, _m=members, _n=names: tuple(c[k] for k in _n) in _m,
            ),
        ),
    )
    stem = path.name.removesuffix(".gz").removesuffix(".json")
    return RecordedSpace(
        name=stem, space=space, records=records, optimum=min(correct), decode=decode
    )


def write_t4(
    path: str | Path,
    rows: Iterable[tuple[Mapping[str, Any], float | None, Sequence[float], float]],
    *,
    failure: str = "runtime",
) -> Path:
    """Write a T4 file, for tests and synthetic benchmarks.

    Args:
        path: Destination; gzip-compressed when it ends in ``.gz``.
        rows: ``(configuration, time, runtimes, compile_time)`` per configuration;
            ``time`` ``None`` marks a failed configuration.
        failure: The ``invalidity`` written for failed configurations.

    Returns:
        The path written.
    """
    path = Path(path)
    results = []
    for config, time, runtimes, compile_time in rows:
        ok = time is not None
        results.append(
            {
                "configuration": dict(config),
                "invalidity": "correct" if ok else failure,
                "correctness": 1 if ok else 0,
                "measurements": [{"name": "time", "value": time if ok else None, "unit": "ms"}],
                "times": {"compilation": compile_time, "runtimes": list(runtimes)},
                "objectives": ["time"],
            }
        )
    doc = {"metadata": {"timeunit": "miliseconds"}, "results": results}
    text = json.dumps(doc)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _record(result: Mapping[str, Any]) -> Record:
    status = str(result.get("invalidity", "correct"))
    times = result.get("times") or {}
    runtimes = tuple(float(x) for x in times.get("runtimes") or () if _finite(x))
    compile_time = float(times.get("compilation") or 0.0)
    time = None
    for m in result.get("measurements") or ():
        if m.get("name") == "time" and _finite(m.get("value")):
            time = float(m["value"])
    if time is None and runtimes:
        time = sum(runtimes) / len(runtimes)
    ok = status == "correct" and time is not None
    return Record(
        ok=ok,
        status=status,
        time=time if ok else None,
        runtimes=runtimes if ok else (),
        compile_time=compile_time,
    )


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_int(v: object) -> bool:
    return isinstance(v, int) or (isinstance(v, float) and v.is_integer())


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, bool):
        return int(v)
    return v


def _sort_key(v: Any) -> tuple[int, Any]:
    if isinstance(v, (int, float)):
        return (0, v)
    return (1, str(v))
