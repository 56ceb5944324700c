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
import re
import sys
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.space import Constraint, Param, SearchSpace

__all__ = ["Record", "RecordedSpace", "T4FileError", "load_t4", "write_t4"]

#: Keys every entry of ``results`` must have (the T4 results schema's ``required``).
_REQUIRED = ("configuration", "times", "invalidity", "correctness")
#: The schema's ``invalidity`` values; only ``correct`` is a successful run.
_INVALIDITY = ("correct", "compile", "runtime", "timeout", "correctness", "constraints")
#: Numbers of ``times`` besides ``runtimes`` (``compilation`` is what Kernel Tuner writes,
#: ``compilation_time`` what the schema names): durations.
_DURATIONS = ("compilation", "compilation_time", "framework", "search_algorithm", "validation")
_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")
_GZIP_MAGIC = b"\x1f\x8b"
#: Deepest array nesting accepted in a parameter value.
_MAX_NESTING = 8
#: Largest integer parameter value kept as is (above it: codes, as for negative values).
_MAX_PARAM = 2**53
_FLOAT_MAX = sys.float_info.max
#: Longest rendering of a value in a message.
_SHOWN = 60
#: What Kernel Tuner records as the time of a failed configuration, per ``invalidity``.
_FAILED = {"compile": "CompilationFailedConfig", "runtime": "RuntimeFailedConfig"}
_KIND: dict[type, str] = {dict: "an object", list: "an array", str: "a string",
                          int: "a number", float: "a number"}


class T4FileError(ValueError):
    """A T4 file that cannot be read: which file, where in it, what is wrong.

    The message is one line, ``FILE: WHERE: PROBLEM`` (``FILE: PROBLEM`` when the file as a
    whole is at fault), WHERE a JSON path such as ``results[17].times.runtimes[2]``.

    Attributes:
        path: The file.
        where: The JSON path of the offending value; empty for the whole file.
        problem: What is wrong with it.
    """

    def __init__(self, path: Path, where: str, problem: str) -> None:
        self.path = path
        self.where = where
        self.problem = problem
        text = f"{path}: {where}: {problem}" if where else f"{path}: {problem}"
        # One line whatever the file name or the JSON holds (a key with a newline).
        super().__init__(text.replace("\r", "\\r").replace("\n", "\\n"))


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
    """Read a T4 file (``.json.gz`` or plain ``.json``), checked against the T4 schema.

    What is checked (beyond the published schema's types, ``required`` keys and
    ``invalidity`` values): every time (``times.*``, ``times.runtimes[*]``, a ``time``
    measurement) is a finite number ``>= 0``, and the time of a correct configuration is
    positive (scores divide by it); parameter values are numbers, strings, booleans,
    nulls or arrays of them, and every result names the same parameters. ``NaN`` and
    ``Infinity`` are not JSON, and a number too large for a float (``1e400``) is no time:
    both are refused, not skipped, since a silently dropped time would change the space.

    Raises:
        T4FileError: what is wrong and where (the file, a JSON path such as
            ``results[17].times.runtimes[2]``), in one line: the file cannot be read or
            decompressed, is not JSON, breaks the schema, holds no results or no correct
            configuration.
    """
    path = Path(path)
    doc = _read_json(path)
    if not isinstance(doc, dict):
        raise T4FileError(path, "", f"the document must be a JSON object, got {_type(doc)}")
    _check_version(path, doc)
    results = doc.get("results")
    if results is None:
        raise T4FileError(path, "results", "missing (no 'results' in T4 file)")
    if not isinstance(results, list):
        raise T4FileError(path, "results", f"must be an array, got {_type(results)}")
    if not results:
        raise T4FileError(path, "results", "empty: the file records no configuration")
    entries = [_entry(path, f"results[{i}]", r) for i, r in enumerate(results)]
    names = tuple(entries[0][0])
    for i, (cfg, _) in enumerate(entries):
        if set(cfg) != set(names):
            raise T4FileError(
                path, f"results[{i}].configuration",
                f"parameters {_show(sorted(cfg))} differ from results[0]'s "
                f"{_show(sorted(names))}",
            )

    raw_values = {n: {_hashable(cfg[n]) for cfg, _ in entries} for n in names}
    codes: dict[str, dict[Any, int]] = {}
    decode: dict[str, tuple[Any, ...]] = {}
    params = []
    for n in names:
        values = raw_values[n]
        if all(_is_int(v) for v in values):
            ordered = sorted(int(v) for v in values)
            codes[n] = {v: int(v) for v in values}
            if ordered[0] < 0 or ordered[-1] > _MAX_PARAM:
                # Param values must be small non-negative integers: shift to codes.
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
    for cfg, record in entries:
        key = tuple(codes[n][_hashable(cfg[n])] for n in names)
        records[key] = record
    correct = [rec.time for rec in records.values() if rec.ok and rec.time is not None]
    if not correct:
        raise T4FileError(path, "results", "no correct configuration in T4 file")

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
                "measurements": [{"name": "time", "value": time if ok else _FAILED.get(
                    failure, "InvalidConfig"), "unit": "ms"}],
                "times": {"compilation": compile_time, "runtimes": list(runtimes)},
                "objectives": ["time"],
            }
        )
    doc = {"schema_version": "1.0.0", "metadata": {"timeunit": "miliseconds"},
           "results": results}
    text = json.dumps(doc)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _read_json(path: Path) -> Any:
    """The file's JSON document; gzip-decompressed when its name ends in ``.gz``."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise T4FileError(path, "", f"cannot read the file: {exc.strerror or exc}") from exc
    if path.name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except gzip.BadGzipFile as exc:
            raise T4FileError(path, "", "not a gzip file (the name ends in .gz)") from exc
        except EOFError as exc:
            # Click would read an EOFError as Ctrl-D and print only "Aborted!".
            raise T4FileError(path, "", "truncated gzip data: the compressed stream "
                                        "ends early") from exc
        except zlib.error as exc:
            raise T4FileError(path, "", f"corrupt gzip data ({exc})") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        hint = " (gzip data: name the file .json.gz)" if raw[:2] == _GZIP_MAGIC else ""
        raise T4FileError(path, "", f"not UTF-8 text at byte {exc.start}{hint}") from exc
    try:
        return json.loads(text, parse_constant=_not_json)
    except json.JSONDecodeError as exc:
        raise T4FileError(
            path, "", f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    except (ValueError, RecursionError) as exc:  # NaN/Infinity, huge integers, deep nesting
        raise T4FileError(path, "", f"invalid JSON: {_first_line(exc)}") from exc


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_version(path: Path, doc: Mapping[str, Any]) -> None:
    if "schema_version" not in doc:
        return
    version = doc["schema_version"]
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise T4FileError(path, "schema_version",
                          f"must be a string MAJOR.MINOR.PATCH, got {_show(version)}")
    if not version.startswith("1."):
        raise T4FileError(path, "schema_version",
                          f"unsupported version {version} (this reader knows 1.x)")


def _entry(path: Path, where: str, result: Any) -> tuple[dict[str, Any], Record]:
    """One entry of ``results``, checked: its configuration and recorded outcome."""
    if not isinstance(result, dict):
        raise T4FileError(path, where, f"must be an object, got {_type(result)}")
    for key in _REQUIRED:
        if key not in result:
            raise T4FileError(path, f"{where}.{key}", "missing (required by the T4 schema)")
    config = result["configuration"]
    if not isinstance(config, dict):
        raise T4FileError(path, f"{where}.configuration",
                          f"must be an object, got {_type(config)}")
    if not config:
        raise T4FileError(path, f"{where}.configuration", "names no parameter")
    for name, value in config.items():
        _check_param_value(path, _key(f"{where}.configuration", name), value, depth=0)
    status = result["invalidity"]
    if status not in _INVALIDITY:
        raise T4FileError(path, f"{where}.invalidity",
                          f"must be one of {', '.join(_INVALIDITY)}; got {_show(status)}")
    if not _is_number(result["correctness"]):
        raise T4FileError(path, f"{where}.correctness",
                          f"must be a number, got {_type(result['correctness'])}")
    for key, kind in (("timestamp", str), ("objectives", list)):
        if key in result and not isinstance(result[key], kind):
            raise T4FileError(path, f"{where}.{key}", f"must be {_KIND[kind]}, "
                                                      f"got {_type(result[key])}")

    times = result["times"]
    if not isinstance(times, dict):
        raise T4FileError(path, f"{where}.times", f"must be an object, got {_type(times)}")
    for key in _DURATIONS:
        if key in times:
            _duration(path, f"{where}.times.{key}", times[key])
    runtimes_raw = times.get("runtimes", [])
    if not isinstance(runtimes_raw, list):
        raise T4FileError(path, f"{where}.times.runtimes",
                          f"must be an array, got {_type(runtimes_raw)}")
    if all(type(x) in (int, float) and 0 <= x <= _FLOAT_MAX for x in runtimes_raw):
        runtimes = tuple(map(float, runtimes_raw))  # the usual case, at a third of the cost
    else:
        runtimes = tuple(_duration(path, f"{where}.times.runtimes[{j}]", x)
                         for j, x in enumerate(runtimes_raw))
    compile_time = float(times.get("compilation", times.get("compilation_time", 0.0)))

    time, time_at = None, f"{where}.times.runtimes"
    measurements = result.get("measurements", [])
    if not isinstance(measurements, list):
        raise T4FileError(path, f"{where}.measurements",
                          f"must be an array, got {_type(measurements)}")
    for j, m in enumerate(measurements):
        at = f"{where}.measurements[{j}]"
        if not isinstance(m, dict):
            raise T4FileError(path, at, f"must be an object, got {_type(m)}")
        for key in ("name", "unit"):
            if key in m and not isinstance(m[key], str):
                raise T4FileError(path, f"{at}.{key}", f"must be a string, got {_type(m[key])}")
        value = m.get("value")
        # null is outside the schema, but earlier versions of write_t4 wrote it for failures.
        if value is not None and not (_is_number(value) or isinstance(value, (str, list))):
            raise T4FileError(path, f"{at}.value",
                              f"must be a number, string or array, got {_type(value)}")
        # A failed configuration records a string here ("RuntimeFailedConfig").
        if m.get("name") == "time" and _is_number(value):
            time, time_at = _duration(path, f"{at}.value", value), f"{at}.value"
    if time is None and runtimes:
        time = sum(runtimes) / len(runtimes)
        if time == math.inf:  # huge finite times: divide each first, so as not to overflow
            time = sum(x / len(runtimes) for x in runtimes)
    ok = status == "correct" and time is not None
    if ok and not time:
        raise T4FileError(path, time_at, "the time of a correct configuration must be "
                                         "positive (scores divide by it), got 0")
    record = Record(
        ok=ok,
        status=status,
        time=time if ok else None,
        runtimes=runtimes if ok else (),
        compile_time=compile_time,
    )
    return config, record


def _check_param_value(path: Path, where: str, value: Any, *, depth: int) -> None:
    if isinstance(value, list):
        if depth >= _MAX_NESTING:
            raise T4FileError(path, where, f"arrays nested deeper than {_MAX_NESTING}")
        for j, item in enumerate(value):
            _check_param_value(path, f"{where}[{j}]", item, depth=depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        raise T4FileError(path, where, f"must be a finite number, got {_show(value)}")
    elif not (value is None or isinstance(value, (str, int, float))):
        raise T4FileError(path, where, "a parameter value must be a number, string, boolean, "
                                       f"null or array of them, got {_type(value)}")


def _duration(path: Path, where: str, value: Any) -> float:
    """A recorded time: a finite number ``>= 0``."""
    if not _is_number(value):
        raise T4FileError(path, where, f"must be a number, got {_type(value)}")
    # An integer beyond the float range (10**400) is no time either: compare, not convert.
    if not 0 <= value <= _FLOAT_MAX:
        raise T4FileError(path, where, f"a time must be a finite number >= 0, got {_show(value)}")
    return float(value)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _type(x: object) -> str:
    """The JSON type of a parsed value, as the schema names it."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "boolean"
    return _KIND.get(type(x), type(x).__name__).split()[-1]


def _show(x: object) -> str:
    """A short one-line rendering of a parsed value, for messages."""
    text = json.dumps(x) if isinstance(x, (dict, list, str)) else repr(x)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _key(where: str, name: str) -> str:
    """The JSON path of member ``name`` of the object at ``where``."""
    return f"{where}.{name}" if name.isidentifier() else f"{where}[{json.dumps(name)}]"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


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
