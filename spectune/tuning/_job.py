"""A nightly job file (TOML): which databases, which shapes, how long.

```toml
name = "mi300x-nightly"                 # names the job in the history and the report
databases = ["/var/lib/spectune/tuned.db"]  # checked and tuned in turn (URL or path)
budget = "6h"                           # wall time of the whole night: 90m, 1h30m, 3600
report_dir = "reports"                  # relative to this file's folder
# optional: storage (default: the studies beside each database), recheck = true,
# workers = 1, sampler = "auto", seed = 0

[[shapes]]                              # one or more groups of shapes
kernels = ["rejection_sample_mrv2"]
spec_lens = [1, 2, 4]                   # or "1-4"
batch_sizes = [1, 8, 64]
vocab_sizes = [128256]
dtypes = ["bfloat16"]                   # default ["float32"]
draft_probs = [true]                    # default [true]
trials = 30                             # evaluations per study (default 30)
# optional: time_budget = "20m" (per study), patience = 10
```

Every error names the file and the key (``job.toml: shapes[0].spec_lens: ...``); unknown
keys are refused, so a typo never silently drops a setting.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.space import DTYPES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["JobError", "NightlyJob", "ShapeGroup", "load_job", "parse_duration"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class JobError(ValueError):
    """A job file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class ShapeGroup:
    """One ``[[shapes]]`` table: the product of its lists, tuned with its limits."""

    kernels: tuple[str, ...]
    spec_lens: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    vocab_sizes: tuple[int, ...]
    dtypes: tuple[str, ...] = ("float32",)
    draft_probs: tuple[bool, ...] = (True,)
    trials: int = 30
    time_budget: float | None = None
    patience: int | None = None


@dataclass(frozen=True)
class NightlyJob:
    """A parsed job file."""

    name: str
    databases: tuple[str, ...]
    budget: float
    report_dir: Path
    shapes: tuple[ShapeGroup, ...]
    storage: str | None = None
    recheck: bool = True
    workers: int = 1
    sampler: str = "auto"
    seed: int = 0
    path: Path | None = None


def parse_duration(value: object, *, where: str) -> float:
    """Seconds from ``3600``, ``"90m"``, ``"1h30m"`` or ``"45s"``.

    Raises:
        JobError: naming ``where``, for anything else, zero or negative.
    """
    if isinstance(value, bool):
        raise JobError(f"{where}: expected a duration like 3600, '90m' or '6h', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*(\d+(\.\d+)?\s*[smhd]\s*)+", value):
        seconds = sum(float(n) * _UNITS[u]
                      for n, _, u in re.findall(r"(\d+(\.\d+)?)\s*([smhd])", value))
    else:
        raise JobError(f"{where}: expected a duration like 3600, '90m' or '6h', got {value!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise JobError(f"{where}: a duration must be finite and > 0, got {value!r}")
    return seconds


def load_job(path: str | Path) -> NightlyJob:
    """Read and check a job file.

    Raises:
        JobError: one line naming the file and the key, for a missing or unreadable
            file, bad TOML, a missing, unknown or invalid key, or a shape past the
            kernels' declared limits.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise JobError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise JobError(f"{path}: is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise JobError(f"{path}: is not valid TOML ({exc})") from None
    return job_from_dict(data, path=path)


def job_from_dict(data: Mapping[str, Any], *, path: Path) -> NightlyJob:
    """A :class:`NightlyJob` from a parsed job file (see :func:`load_job`)."""
    w = _Where(path)
    _known(data, {"name", "databases", "database", "budget", "report_dir", "storage",
                  "recheck", "workers", "sampler", "seed", "shapes"}, w)
    name = _text(data, "name", w, required=True)
    if "database" in data and "databases" in data:
        raise JobError(w("database", "give 'databases' or 'database', not both"))
    if "database" in data:
        databases: tuple[str, ...] = (_text(data, "database", w, required=True),)
    else:
        databases = tuple(_list(data, "databases", w, str, required=True))
        if not databases or any(not d.strip() for d in databases):
            raise JobError(w("databases", "expected a non-empty list of URLs or paths"))
    if "budget" not in data:
        raise JobError(w("budget", "missing (the night's wall time, e.g. '6h')"))
    budget = parse_duration(data["budget"], where=w("budget"))
    report = Path(_text(data, "report_dir", w) or "spectune-reports").expanduser()
    if not report.is_absolute():
        report = path.parent / report
    storage = _text(data, "storage", w) or None
    recheck = data.get("recheck", True)
    if not isinstance(recheck, bool):
        raise JobError(w("recheck", f"expected true or false, got {recheck!r}"))
    workers = _int(data, "workers", w, default=1)
    seed = _int(data, "seed", w, default=0, minimum=0)
    sampler = _text(data, "sampler", w) or "auto"
    from spectune.search import STRATEGIES

    if sampler not in STRATEGIES:
        raise JobError(w("sampler", f"expected one of {sorted(STRATEGIES)}, got {sampler!r}"))
    raw_shapes = data.get("shapes")
    if not isinstance(raw_shapes, list) or not raw_shapes:
        raise JobError(w("shapes", "expected one or more [[shapes]] tables"))
    shapes = tuple(_group(s, w.at(f"shapes[{i}]")) for i, s in enumerate(raw_shapes))
    return NightlyJob(name=name, databases=databases, budget=budget, report_dir=report,
                      shapes=shapes, storage=storage, recheck=recheck, workers=workers,
                      sampler=sampler, seed=seed, path=path)


class _Where:
    """Builds ``FILE: key: problem`` messages."""

    def __init__(self, path: Path, prefix: str = "") -> None:
        self.path = path
        self.prefix = prefix

    def at(self, prefix: str) -> _Where:
        return _Where(self.path, prefix)

    def __call__(self, key: str, problem: str | None = None) -> str:
        full = f"{self.prefix}.{key}" if self.prefix else key
        return f"{self.path}: {full}" + ("" if problem is None else f": {problem}")


def _known(data: object, allowed: set[str], w: _Where) -> None:
    if not isinstance(data, Mapping):
        raise JobError(f"{w.path}: {w.prefix or 'the file'}: expected a table")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise JobError(w(unknown[0], f"unknown key (known: {', '.join(sorted(allowed))})"))


def _text(data: Mapping[str, Any], key: str, w: _Where, *, required: bool = False) -> str:
    value = data.get(key)
    if value is None:
        if required:
            raise JobError(w(key, "missing"))
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise JobError(w(key, f"expected a non-empty string, got {value!r}"))
    return value


def _int(data: Mapping[str, Any], key: str, w: _Where, *, default: int | None,
         minimum: int = 1) -> Any:
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise JobError(w(key, f"expected an integer >= {minimum}, got {value!r}"))
    return value


def _list(data: Mapping[str, Any], key: str, w: _Where, kind: type, *,
          required: bool = False, default: Sequence[Any] = ()) -> list[Any]:
    if key not in data:
        if required:
            raise JobError(w(key, "missing"))
        return list(default)
    value = data[key]
    if not isinstance(value, list) or not value:
        raise JobError(w(key, f"expected a non-empty list, got {value!r}"))
    for item in value:
        if not isinstance(item, kind) or (kind is int and isinstance(item, bool)):
            raise JobError(w(key, f"expected a list of {kind.__name__}, got {item!r}"))
    return value


def _ints(data: Mapping[str, Any], key: str, w: _Where) -> tuple[int, ...]:
    from spectune.tuning.problems import parse_int_list

    value = data.get(key)
    if isinstance(value, str):
        try:
            # Checked as written, before a range is expanded (as the sweep's options).
            if any(len(d) > 9 for d in re.findall(r"\d+", value)):
                raise ValueError(f"{value!r} holds a number past every kernel's limit")
            return tuple(parse_int_list(value, name=key))
        except ValueError as exc:
            raise JobError(w(key, str(exc))) from None
    values = _list(data, key, w, int, required=True)
    if any(v < 1 for v in values):
        raise JobError(w(key, f"expected positive integers, got {values!r}"))
    return tuple(sorted(set(values)))


def _group(data: object, w: _Where) -> ShapeGroup:
    _known(data, {"kernels", "spec_lens", "batch_sizes", "vocab_sizes", "dtypes",
                  "draft_probs", "trials", "time_budget", "patience"}, w)
    assert isinstance(data, Mapping)
    from spectune.kernels import FAMILIES, declared_limits

    kernels = tuple(_list(data, "kernels", w, str, required=True))
    for kernel in kernels:
        if kernel not in FAMILIES:
            raise JobError(w("kernels", f"unknown kernel family {kernel!r}; known: "
                                        f"{', '.join(sorted(FAMILIES))}"))
    dims = {key: _ints(data, key, w) for key in ("spec_lens", "batch_sizes", "vocab_sizes")}
    for kernel in kernels:
        limits = declared_limits(FAMILIES[kernel])
        if limits is None:
            continue
        for key, dim in (("spec_lens", "spec_len"), ("batch_sizes", "batch"),
                         ("vocab_sizes", "vocab")):
            limit = getattr(limits, dim)
            if max(dims[key]) > limit:
                raise JobError(w(key, f"{max(dims[key])} is past {kernel}'s declared limit "
                                      f"of {limit}"))
    dtypes = tuple(_list(data, "dtypes", w, str, default=("float32",)))
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise JobError(w("dtypes", f"expected some of {list(DTYPES)}, got {dtype!r}"))
    draft_probs = tuple(_list(data, "draft_probs", w, bool, default=(True,)))
    time_budget = (None if data.get("time_budget") is None
                   else parse_duration(data["time_budget"], where=w("time_budget")))
    return ShapeGroup(
        kernels=kernels, spec_lens=dims["spec_lens"], batch_sizes=dims["batch_sizes"],
        vocab_sizes=dims["vocab_sizes"], dtypes=dtypes, draft_probs=draft_probs,
        trials=_int(data, "trials", w, default=30), time_budget=time_budget,
        patience=_int(data, "patience", w, default=None),
    )
