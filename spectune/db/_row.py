"""One tuned row as a plain value (and the batch buckets rows are tuned at).

:class:`TunedRow` is what callers build (the tuner), what readers return and what files
hold. It checks itself when built, so a row that exists is well formed; whether its
config belongs to a kernel's search space is for :mod:`spectune.db._checks`. Its
fields, key and dict form come from :data:`spectune.db._fields.ROW_FIELDS`.

Batch buckets (:func:`batch_bucket`, :func:`is_batch_bucket`) are defined in
:mod:`spectune.db._buckets`, which the serving path imports without this module.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from operator import attrgetter
from typing import Any

from spectune.db._buckets import batch_bucket, is_batch_bucket
from spectune.db._fields import (
    FIELDS,
    LATER_FIELDS,
    PROVENANCE_FIELDS,
    ROW_FIELDS,
    TEXT_MAX,
    VLLM_FIELDS,
    VS_VLLM_VERDICTS,
    Field,
    check_config,
    number,
    parse_time,
    utc,
)
from spectune.db.errors import InvalidRowError, MalformedRowError
from spectune.identity import DeviceIdentity, SoftwareIdentity
from spectune.messages import one_line, shorten
from spectune.promotion import Timing
from spectune.space import Problem

__all__ = [
    "Provenance",
    "RowKey",
    "TunedRow",
    "VllmComparison",
    "batch_bucket",
    "is_batch_bucket",
    "row_from_stored",
    "utc_now",
]

#: The keys a row's dict form may lack (an older file): they read as their ``missing``.
_LATER = {f.name: f.missing for f in LATER_FIELDS}

#: A row's key: the values of :data:`spectune.db._fields.KEY_FIELDS`, in order.
RowKey = tuple[Any, ...]

#: The types of the parts of a row that hold several fields.
_PARTS: dict[str, type] = {
    "device": DeviceIdentity,
    "software": SoftwareIdentity,
    "problem": Problem,
    "tuned": Timing,
    "default": Timing,
}
_KEY = attrgetter(*(f.path for f in ROW_FIELDS if f.key))
_PROVENANCE_NAMES = tuple(f.name for f in PROVENANCE_FIELDS)


def utc_now() -> datetime:
    """The current time in UTC, to the microsecond."""
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class VllmComparison:
    """How a row's config compared with vLLM's own function, measured side by side.

    The sweep times vLLM's function on the same problem and device as the tuned config;
    the plugin serves the config in place of vLLM's function only where the verdict is
    ``faster`` for the vLLM version installed.

    Attributes:
        verdict: One of :data:`spectune.db.VS_VLLM_VERDICTS`: ``faster``, ``not
            faster`` or ``not measured``.
        p50_us: vLLM's function's median, µs: set exactly when measured (``faster``,
            ``not faster``).
        version: The vLLM version measured under (``0.32.0``): required when measured;
            may be set when not measured (vLLM was there but could not be compared).
        reason: Why ``not measured`` (``vLLM is not installed``, ``vLLM's function
            raised: ...``, ``vLLM returned different tokens``); ``None`` when measured.
            Kept as one printable line of at most 256 characters (the first line of
            what is given, shortened).
        peak_mib: vLLM's function's peak device memory over one call, MiB (what the
            call allocated beyond what was allocated before it); measured on a GPU only,
            ``None`` under the CPU interpreter and when not measured.
        tuned_peak_mib: The same for the row's config, in the same comparison.
    """

    verdict: str = "not measured"
    p50_us: float | None = None
    version: str | None = None
    reason: str | None = None
    peak_mib: float | None = None
    tuned_peak_mib: float | None = None

    def __post_init__(self) -> None:
        verdict = self.verdict
        if not isinstance(verdict, str) or verdict not in VS_VLLM_VERDICTS:
            raise ValueError(f"vs_vllm must be one of {VS_VLLM_VERDICTS}, got {shorten(verdict)}")
        if self.reason is not None:
            if not isinstance(self.reason, str) or not self.reason.strip():
                raise ValueError(f"vllm_reason must be non-empty text, got {shorten(self.reason)}")
            object.__setattr__(self, "reason", one_line(self.reason, limit=TEXT_MAX))
        if verdict == "not measured":
            if self.p50_us is not None:
                raise ValueError("vllm_p50_us must be None when vs_vllm is 'not measured'")
            if self.peak_mib is not None or self.tuned_peak_mib is not None:
                raise ValueError("vllm_peak_mib and tuned_peak_mib must be None when vs_vllm "
                                 "is 'not measured'")
        else:
            if self.p50_us is None or self.version is None:
                raise ValueError(
                    f"vllm_p50_us and vllm_version must be set when vs_vllm is {verdict!r}"
                )
            if self.reason is not None:
                raise ValueError(f"vllm_reason must be None when vs_vllm is {verdict!r}")
            object.__setattr__(self, "p50_us", number("vllm_p50_us", self.p50_us))
            for name, attribute in (("vllm_peak_mib", "peak_mib"),
                                    ("tuned_peak_mib", "tuned_peak_mib")):
                value = getattr(self, attribute)
                if value is not None:
                    object.__setattr__(self, attribute, number(name, value))
        for f in VLLM_FIELDS:
            f.check(getattr(self, f.attribute))

    @property
    def measured(self) -> bool:
        """Whether vLLM's function was timed (the verdict is ``faster`` or ``not faster``)."""
        return self.verdict != "not measured"


_PARTS["vllm"] = VllmComparison  # a part like the timings (defined after _PARTS)


@dataclass(frozen=True)
class Provenance:
    """Who measured a config, when, and what they measured.

    A row's own provenance is its ``host``, ``study`` and ``tuned_at``; its ``history``
    keeps the provenances of the measurements it won against (or that were merged in
    without replacing it), so a merge never loses who measured what.
    """

    host: str
    study: str
    tuned_at: datetime
    trials: int
    tuning_seconds: float
    config: dict[str, int]
    tuned: Timing

    def __post_init__(self) -> None:
        _check_parts(self, ("tuned",))
        _check_fields(self, PROVENANCE_FIELDS)

    @property
    def identity(self) -> tuple[str, str, datetime]:
        """What tells two provenances apart: host, study and time."""
        return (self.host, self.study, self.tuned_at)

    def to_dict(self) -> dict[str, Any]:
        """The entry as a flat JSON-able object (the provenance fields of a row)."""
        return {f.name: f.to_plain(f.read(self)) for f in PROVENANCE_FIELDS}

    @classmethod
    def from_dict(cls, data: object) -> Provenance:
        """Parse :meth:`to_dict`'s output; raises ``ValueError`` naming the bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"history entry must be an object, got {type(data).__name__}")
        _exact_keys("history entry", data, _PROVENANCE_NAMES)
        return cls(**_arguments(PROVENANCE_FIELDS, data))


@dataclass(frozen=True)
class TunedRow:
    """A tuned launch configuration and everything needed to decide where it applies.

    Attributes:
        device: The device it was measured on.
        software: Triton, torch, runtime and spectune versions it was measured with.
        kernel: Kernel family name.
        kernel_hash: Hash of the kernel family's source.
        problem: The problem; ``problem.batch`` is a batch bucket (a power of two, see
            :func:`spectune.db.batch_bucket`).
        config: The launch configuration, parameter name -> non-negative integer.
        tuned: Timing of ``config``, µs.
        default: Timing of the kernel's default config on the same problem, µs.
        trials: Trials the study ran.
        tuning_seconds: Wall time of the study.
        host: Host the study ran on.
        study: Study name.
        tuned_at: When it was measured (timezone-aware; stored in UTC).
        history: Provenances of other measurements of the same key (see
            :class:`Provenance`), oldest first.
        vllm: How ``config`` compared with vLLM's own function (not measured unless
            the sweep measured it).
    """

    device: DeviceIdentity
    software: SoftwareIdentity
    kernel: str
    kernel_hash: str
    problem: Problem
    config: dict[str, int]
    tuned: Timing
    default: Timing
    trials: int
    tuning_seconds: float
    host: str
    study: str
    tuned_at: datetime = field(default_factory=utc_now)
    history: tuple[Provenance, ...] = ()
    vllm: VllmComparison = field(default_factory=VllmComparison)

    def __post_init__(self) -> None:
        _check_parts(self, tuple(_PARTS))
        _check_fields(self, ROW_FIELDS)
        if not math.isfinite(self.speedup):  # e.g. 1e300 / 1e-300: no JSON can hold it
            raise ValueError(
                f"speedup (default_p50_us / tuned_p50_us) must be finite, got "
                f"{self.default.p50!r} / {self.tuned.p50!r}"
            )
        if not is_batch_bucket(self.problem.batch):
            raise ValueError(
                f"problem.batch must be a batch bucket (a power of two), got "
                f"{self.problem.batch}; tune at batch_bucket({self.problem.batch}) = "
                f"{batch_bucket(self.problem.batch)}"
            )

    @property
    def speedup(self) -> float:
        """Median of the default over median of the tuned config (> 1: tuning helped)."""
        return self.default.p50 / self.tuned.p50

    @property
    def vs_vllm_ratio(self) -> float | None:
        """vLLM's function's median over the tuned config's (> 1: faster than vLLM), or
        ``None`` when not measured."""
        p50 = self.vllm.p50_us
        return None if p50 is None else p50 / self.tuned.p50

    @property
    def key(self) -> RowKey:
        """The values of the key fields: one row per key in a database."""
        return _KEY(self)  # type: ignore[no-any-return]

    @property
    def provenance(self) -> Provenance:
        """This row's own measurement, as a history entry."""
        return Provenance(**{name: getattr(self, name) for name in _PROVENANCE_ATTRIBUTES})

    def to_dict(self) -> dict[str, Any]:
        """The row as one flat JSON-able object with the keys of ``FIELDS``."""
        return {f.name: f.to_plain(f.read(self)) for f in ROW_FIELDS}

    @classmethod
    def from_dict(cls, data: object) -> TunedRow:
        """Parse :meth:`to_dict`'s output strictly.

        Raises:
            InvalidRowError: naming the offending field (unknown or missing keys, wrong
                types, hostile strings, a ``speedup`` that disagrees with the timings).
        """
        try:
            return _row_from_dict(data)
        except InvalidRowError:
            raise
        except (ValueError, TypeError) as exc:
            raise InvalidRowError(str(exc)) from None

    def replace_history(self, history: Iterable[Provenance]) -> TunedRow:
        """A copy of this row with another history."""
        return replace(self, history=tuple(history))

    def replace_vllm(self, vllm: VllmComparison) -> TunedRow:
        """A copy of this row with another comparison with vLLM."""
        return replace(self, vllm=vllm)


#: The attributes of a Provenance (those a row shares with its history entries).
_PROVENANCE_ATTRIBUTES = tuple(Provenance.__dataclass_fields__)


def row_from_stored(values: Sequence[Any], *, location: str, row_id: object) -> TunedRow:
    """The row a database holds, from the values of its columns in field order.

    Each field is checked on its own first, so the error names the field that is wrong
    (then what only several fields together can break: a timing's order, the batch
    bucket, the speedup).

    Args:
        values: One value per field of ``ROW_FIELDS``, as the database driver returns
            it (see :meth:`spectune.db._fields.Field.from_stored`).
        location: The database, for messages.
        row_id: The row's ``id`` column, for messages.

    Raises:
        MalformedRowError: the stored row is malformed (edited by hand), naming the
            database, the row (id and key) and the field.
    """
    data: dict[str, Any] = {}
    for f, value in zip(ROW_FIELDS, values, strict=True):
        try:
            data[f.name] = f.from_stored(value)
            _check_plain(f, data[f.name])
        except (ValueError, TypeError) as exc:
            raise _malformed(values, location, row_id, f.name, str(exc)) from None
    broken = next(_across_fields(data), None)
    if broken is not None:
        raise _malformed(values, location, row_id, *broken)
    try:
        return TunedRow.from_dict(data)
    except InvalidRowError as exc:  # every check above passed: not expected, still named
        raise _malformed(values, location, row_id, "row", str(exc)) from None


#: Where the key fields are among a stored row's values.
_KEY_INDEXES = tuple(i for i, f in enumerate(ROW_FIELDS) if f.key)


def stored_key(values: Sequence[Any]) -> str:
    """A stored row's key fields as stored, in one printable line (for messages)."""
    shown = {ROW_FIELDS[i].name: _as_shown(values[i]) for i in _KEY_INDEXES}
    return (
        "{kernel} {kernel_hash} on {backend} {arch} {device_name} cu_count={cu_count} "
        "warp_size={warp_size} triton {triton_version}: spec_len={spec_len} batch={batch} "
        "vocab={vocab} {dtype} draft_probs={draft_probs}"
    ).format(**shown)


def _as_shown(value: Any) -> str:
    """A stored value for a message: plain when it is short printable ASCII text."""
    if isinstance(value, str) and value.isascii() and value.isprintable() and len(value) <= 40:
        return value
    return shorten(value, limit=40)


def _malformed(
    values: Sequence[Any], location: str, row_id: object, field: str, problem: str
) -> MalformedRowError:
    return MalformedRowError(
        location=location, row_id=row_id, field=field, problem=problem, key=stored_key(values)
    )


def _check_plain(f: Field, value: Any) -> None:
    """Check one field of a row's dict form on its own (``ValueError`` naming it)."""
    if f.kind == "time":
        parse_time(f.name, value)
    elif f.kind == "json" and f.nullable:
        if not isinstance(value, list):
            raise ValueError(f"{f.name} must be a list, got {type(value).__name__}")
        for position, entry in enumerate(value, start=1):
            _history_entry(position, entry)
    elif f.kind == "json":
        check_config(value)
    elif f.derived:
        number(f.name, value)
    else:
        f.check(value)


def _across_fields(data: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    """(field, problem) for what fields checked one by one can still break together."""
    if not is_batch_bucket(data["batch"]):
        yield "batch", f"batch must be a batch bucket (a power of two), got {data['batch']}"
    for prefix in ("tuned", "default"):
        names = tuple(f"{prefix}_{q}_us" for q in ("p20", "p50", "p80"))
        p20, p50, p80 = (data[name] for name in names)
        if not p20 <= p50 <= p80:
            yield ", ".join(names), f"{' <= '.join(names)} does not hold: {p20}, {p50}, {p80}"
    speedup = data["default_p50_us"] / data["tuned_p50_us"]
    if not math.isclose(number("speedup", data["speedup"]), speedup, rel_tol=1e-9):
        stored = data["speedup"]
        why = f"disagrees with default_p50_us / tuned_p50_us = {speedup!r}"
        yield "speedup", f"speedup {stored!r} {why}"
    try:
        VllmComparison(**{f.attribute: data[f.name] for f in VLLM_FIELDS})
    except ValueError as exc:
        yield ", ".join(f.name for f in VLLM_FIELDS), str(exc)


def _check_parts(value: object, parts: Iterable[str]) -> None:
    for name in parts:
        part = getattr(value, name)
        expected = _PARTS[name]
        if not isinstance(part, expected):
            raise ValueError(f"{name} must be a {expected.__name__}, got {type(part).__name__}")


def _check_fields(value: object, fields: Iterable[Field]) -> None:
    """Check the fields ``value`` holds itself; normalise configs, times and histories."""
    for f in fields:
        if f.kind == "time":
            object.__setattr__(value, f.path, utc(f.name, f.read(value)))
        elif f.kind == "json" and f.nullable:
            history = tuple(f.read(value))
            if any(not isinstance(p, Provenance) for p in history):
                raise ValueError("history must hold Provenance entries")
            object.__setattr__(value, f.path, history)
        elif f.kind == "json":
            object.__setattr__(value, f.path, check_config(f.read(value)))
        else:
            f.check(f.read(value))


def _arguments(fields: Iterable[Field], data: Mapping[str, Any]) -> dict[str, Any]:
    """Constructor arguments of a row or an entry from its dict form (not its history)."""
    arguments: dict[str, Any] = {}
    parts: dict[str, dict[str, Any]] = {}
    for f in fields:
        if f.derived or (f.nullable and f.kind == "json"):  # the history: the caller's
            continue
        value = data[f.name]
        if f.kind == "time":
            value = parse_time(f.name, value)
        elif f.kind == "float" and value is not None:  # too large an int is refused here
            value = number(f.name, value)
        if f.owner is None:
            arguments[f.attribute] = value
        else:
            parts.setdefault(f.owner, {})[f.attribute] = value
    for owner, values in parts.items():
        kind = _PARTS[owner]
        try:
            arguments[owner] = kind(**values)
        except (TypeError, ValueError) as exc:
            if kind is not Timing:
                raise
            raise ValueError(f"{owner} timing: {exc}") from None
    return arguments


def _row_from_dict(data: object) -> TunedRow:
    if not isinstance(data, Mapping):
        raise ValueError(f"row must be an object, got {type(data).__name__}")
    _exact_keys("row", data, FIELDS, optional=_LATER)
    data = {**_LATER, **data}
    history = data["history"]
    if not isinstance(history, list):
        raise ValueError(f"history must be a list, got {type(history).__name__}")
    row = TunedRow(
        **_arguments(ROW_FIELDS, data),
        history=tuple(_history_entry(position, h) for position, h in enumerate(history, start=1)),
    )
    speedup = number("speedup", data["speedup"])
    if not math.isclose(speedup, row.speedup, rel_tol=1e-9):
        raise ValueError(
            f"speedup {speedup!r} disagrees with default_p50_us / tuned_p50_us = {row.speedup!r}"
        )
    return row


def _history_entry(position: int, data: object) -> Provenance:
    """One entry of a row's history; the error names the entry as well as its field."""
    try:
        return Provenance.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"history entry {position}: {exc}") from None


def _exact_keys(
    what: str, data: Mapping[Any, Any], expected: tuple[str, ...],
    optional: Mapping[str, Any] | None = None,
) -> None:
    """Raise unless ``data``'s keys are ``expected`` (those of ``optional`` may lack)."""
    unknown = [k for k in data if k not in expected]
    if unknown:
        shown = ", ".join(ascii(k) for k in unknown[:5])
        raise ValueError(f"{what} has unknown key(s) {shown}")
    missing = [k for k in expected if k not in data and k not in (optional or ())]
    if missing:
        raise ValueError(f"{what} lacks key(s) {', '.join(missing)}")
