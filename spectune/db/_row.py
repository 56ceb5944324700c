"""One tuned row as a plain value: identity, problem, config, measurements, provenance.

:class:`TunedRow` is what callers build (the tuner), what readers return and what
files hold. It checks itself when built, so a row that exists is well formed; whether
its config belongs to a kernel's search space is for :mod:`spectune.db._checks`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from spectune.db._buckets import batch_bucket, is_batch_bucket
from spectune.db._errors import InvalidRowError
from spectune.db._names import check_config_key, check_name, check_text, shorten
from spectune.identity import DeviceIdentity, SoftwareIdentity
from spectune.promotion import Timing
from spectune.space import BACKENDS, Problem

__all__ = ["FIELDS", "KEY_FIELDS", "Provenance", "RowKey", "TunedRow", "utc_now"]

#: The columns that make a row's identity: one row per key in a database.
KEY_FIELDS = (
    "kernel",
    "kernel_hash",
    "backend",
    "arch",
    "device_name",
    "cu_count",
    "warp_size",
    "triton_version",
    "spec_len",
    "batch",
    "vocab",
    "dtype",
    "draft_probs",
)

#: Every field of a row as exported (JSON, CSV) and stored (one column each), in order.
FIELDS = (
    *KEY_FIELDS,
    "torch_version",
    "runtime_version",
    "spectune_version",
    "config",
    "tuned_p20_us",
    "tuned_p50_us",
    "tuned_p80_us",
    "default_p20_us",
    "default_p50_us",
    "default_p80_us",
    "speedup",
    "trials",
    "tuning_seconds",
    "tuned_at",
    "host",
    "study",
    "history",
)

#: A row's key: the values of :data:`KEY_FIELDS`, in order.
RowKey = tuple[Any, ...]


def utc_now() -> datetime:
    """The current time in UTC, to the microsecond."""
    return datetime.now(timezone.utc)


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
        check_text("host", self.host)
        check_text("study", self.study)
        object.__setattr__(self, "tuned_at", _utc("tuned_at", self.tuned_at))
        _count("trials", self.trials, minimum=0)
        _seconds("tuning_seconds", self.tuning_seconds)
        object.__setattr__(self, "config", _config(self.config))
        if not isinstance(self.tuned, Timing):
            raise ValueError(f"tuned must be a Timing, got {type(self.tuned).__name__}")

    @property
    def identity(self) -> tuple[str, str, datetime]:
        """What tells two provenances apart: host, study and time."""
        return (self.host, self.study, self.tuned_at)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "study": self.study,
            "tuned_at": self.tuned_at.isoformat(),
            "trials": self.trials,
            "tuning_seconds": self.tuning_seconds,
            "config": dict(self.config),
            "tuned_p20_us": self.tuned.p20,
            "tuned_p50_us": self.tuned.p50,
            "tuned_p80_us": self.tuned.p80,
        }

    @classmethod
    def from_dict(cls, data: object) -> Provenance:
        """Parse :meth:`to_dict`'s output; raises ``ValueError`` naming the bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"history entry must be an object, got {type(data).__name__}")
        _exact_keys("history entry", data, _PROVENANCE_KEYS)
        return cls(
            host=data["host"],
            study=data["study"],
            tuned_at=_parse_time("tuned_at", data["tuned_at"]),
            trials=data["trials"],
            tuning_seconds=data["tuning_seconds"],
            config=data["config"],
            tuned=_timing("tuned", data, "tuned"),
        )


_PROVENANCE_KEYS = (
    "host",
    "study",
    "tuned_at",
    "trials",
    "tuning_seconds",
    "config",
    "tuned_p20_us",
    "tuned_p50_us",
    "tuned_p80_us",
)


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

    def __post_init__(self) -> None:
        if not isinstance(self.device, DeviceIdentity):
            raise ValueError(f"device must be a DeviceIdentity, got {type(self.device).__name__}")
        if self.device.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.device.backend!r}")
        check_name("arch", self.device.arch)
        check_name("device_name", self.device.device_name)
        _count("cu_count", self.device.cu_count, minimum=1)
        _count("warp_size", self.device.warp_size, minimum=1)
        if not isinstance(self.software, SoftwareIdentity):
            raise ValueError(
                f"software must be a SoftwareIdentity, got {type(self.software).__name__}"
            )
        check_name("triton_version", self.software.triton)
        check_name("torch_version", self.software.torch)
        check_name("runtime_version", self.software.runtime)
        check_name("spectune_version", self.software.spectune)
        check_name("kernel", self.kernel)
        check_name("kernel_hash", self.kernel_hash)
        if not isinstance(self.problem, Problem):
            raise ValueError(f"problem must be a Problem, got {type(self.problem).__name__}")
        if not is_batch_bucket(self.problem.batch):
            raise ValueError(
                f"problem.batch must be a batch bucket (a power of two), got "
                f"{self.problem.batch}; tune at batch_bucket({self.problem.batch}) = "
                f"{batch_bucket(self.problem.batch)}"
            )
        if not isinstance(self.problem.draft_probs, bool):
            raise ValueError(f"draft_probs must be a bool, got {self.problem.draft_probs!r}")
        object.__setattr__(self, "config", _config(self.config))
        for name in ("tuned", "default"):
            if not isinstance(getattr(self, name), Timing):
                raise ValueError(f"{name} must be a Timing")
        _count("trials", self.trials, minimum=0)
        _seconds("tuning_seconds", self.tuning_seconds)
        check_text("host", self.host)
        check_text("study", self.study)
        object.__setattr__(self, "tuned_at", _utc("tuned_at", self.tuned_at))
        history = tuple(self.history)
        if any(not isinstance(p, Provenance) for p in history):
            raise ValueError("history must hold Provenance entries")
        object.__setattr__(self, "history", history)

    @property
    def speedup(self) -> float:
        """Median of the default over median of the tuned config (> 1: tuning helped)."""
        return self.default.p50 / self.tuned.p50

    @property
    def key(self) -> RowKey:
        """The values of :data:`KEY_FIELDS`: one row per key in a database."""
        d, p = self.device, self.problem
        return (
            self.kernel,
            self.kernel_hash,
            d.backend,
            d.arch,
            d.device_name,
            d.cu_count,
            d.warp_size,
            self.software.triton,
            p.spec_len,
            p.batch,
            p.vocab,
            p.dtype,
            p.draft_probs,
        )

    @property
    def provenance(self) -> Provenance:
        """This row's own measurement, as a history entry."""
        return Provenance(
            host=self.host,
            study=self.study,
            tuned_at=self.tuned_at,
            trials=self.trials,
            tuning_seconds=self.tuning_seconds,
            config=self.config,
            tuned=self.tuned,
        )

    def to_dict(self) -> dict[str, Any]:
        """The row as one flat JSON-able object with the keys of :data:`FIELDS`."""
        d, s, p = self.device, self.software, self.problem
        return {
            "kernel": self.kernel,
            "kernel_hash": self.kernel_hash,
            "backend": d.backend,
            "arch": d.arch,
            "device_name": d.device_name,
            "cu_count": d.cu_count,
            "warp_size": d.warp_size,
            "triton_version": s.triton,
            "spec_len": p.spec_len,
            "batch": p.batch,
            "vocab": p.vocab,
            "dtype": p.dtype,
            "draft_probs": p.draft_probs,
            "torch_version": s.torch,
            "runtime_version": s.runtime,
            "spectune_version": s.spectune,
            "config": dict(self.config),
            "tuned_p20_us": self.tuned.p20,
            "tuned_p50_us": self.tuned.p50,
            "tuned_p80_us": self.tuned.p80,
            "default_p20_us": self.default.p20,
            "default_p50_us": self.default.p50,
            "default_p80_us": self.default.p80,
            "speedup": self.speedup,
            "trials": self.trials,
            "tuning_seconds": self.tuning_seconds,
            "tuned_at": self.tuned_at.isoformat(),
            "host": self.host,
            "study": self.study,
            "history": [h.to_dict() for h in self.history],
        }

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

    def replace_history(self, history: tuple[Provenance, ...]) -> TunedRow:
        """A copy of this row with another history."""
        return TunedRow(
            device=self.device,
            software=self.software,
            kernel=self.kernel,
            kernel_hash=self.kernel_hash,
            problem=self.problem,
            config=self.config,
            tuned=self.tuned,
            default=self.default,
            trials=self.trials,
            tuning_seconds=self.tuning_seconds,
            host=self.host,
            study=self.study,
            tuned_at=self.tuned_at,
            history=history,
        )


def _row_from_dict(data: object) -> TunedRow:
    if not isinstance(data, Mapping):
        raise ValueError(f"row must be an object, got {type(data).__name__}")
    _exact_keys("row", data, FIELDS)
    history = data["history"]
    if not isinstance(history, list):
        raise ValueError(f"history must be a list, got {type(history).__name__}")
    row = TunedRow(
        device=DeviceIdentity(
            backend=data["backend"],
            arch=data["arch"],
            device_name=data["device_name"],
            cu_count=data["cu_count"],
            warp_size=data["warp_size"],
        ),
        software=SoftwareIdentity(
            triton=data["triton_version"],
            torch=data["torch_version"],
            runtime=data["runtime_version"],
            spectune=data["spectune_version"],
        ),
        kernel=data["kernel"],
        kernel_hash=data["kernel_hash"],
        problem=Problem(
            spec_len=data["spec_len"],
            batch=data["batch"],
            vocab=data["vocab"],
            dtype=data["dtype"],
            draft_probs=data["draft_probs"],
        ),
        config=data["config"],
        tuned=_timing("tuned", data, "tuned"),
        default=_timing("default", data, "default"),
        trials=data["trials"],
        tuning_seconds=data["tuning_seconds"],
        host=data["host"],
        study=data["study"],
        tuned_at=_parse_time("tuned_at", data["tuned_at"]),
        history=tuple(Provenance.from_dict(h) for h in history),
    )
    speedup = data["speedup"]
    if isinstance(speedup, bool) or not isinstance(speedup, (int, float)):
        raise ValueError(f"speedup must be a number, got {speedup!r}")
    if not math.isclose(speedup, row.speedup, rel_tol=1e-9):
        raise ValueError(
            f"speedup {speedup!r} disagrees with default_p50_us / tuned_p50_us = {row.speedup!r}"
        )
    return row


def _exact_keys(what: str, data: Mapping[Any, Any], expected: tuple[str, ...]) -> None:
    unknown = [k for k in data if k not in expected]
    if unknown:
        shown = ", ".join(ascii(k) for k in unknown[:5])
        raise ValueError(f"{what} has unknown key(s) {shown}")
    missing = [k for k in expected if k not in data]
    if missing:
        raise ValueError(f"{what} lacks key(s) {', '.join(missing)}")


def _timing(what: str, data: Mapping[str, Any], prefix: str) -> Timing:
    values = [data[f"{prefix}_{q}_us"] for q in ("p20", "p50", "p80")]
    try:
        return Timing(*values)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} timing: {exc}") from None


def _config(config: object) -> dict[str, int]:
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be an object, got {type(config).__name__}")
    if not config:
        raise ValueError("config must not be empty")
    out: dict[str, int] = {}
    for key, value in config.items():
        check_config_key(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config[{key!r}] must be an integer, got {shorten(value)}")
        if value < 0:
            raise ValueError(f"config[{key!r}] must not be negative, got {value}")
        if value > 2**31 - 1:
            raise ValueError(f"config[{key!r}] is too large, got {value}")
        out[key] = value
    return out


def _count(what: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {shorten(value)}")
    if value > 2**31 - 1:
        raise ValueError(f"{what} is too large, got {value}")
    return value


def _seconds(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {shorten(value)}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be finite and non-negative, got {value!r}")
    return float(value)


def _utc(what: str, value: object) -> datetime:
    if not isinstance(value, datetime):
        raise ValueError(f"{what} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got {value.isoformat()}")
    return value.astimezone(timezone.utc)


def _parse_time(what: str, value: object) -> datetime:
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError(f"{what} must be an ISO 8601 string, got {shorten(value)}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{what} must be an ISO 8601 time, got {shorten(value)}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{what} must include a UTC offset, got {shorten(value)}")
    return parsed
