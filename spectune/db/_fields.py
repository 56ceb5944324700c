"""The one list of a tuned row's fields, and the checks of the values they hold.

Every form a row takes is derived from :data:`ROW_FIELDS`: :class:`spectune.db.TunedRow`
(its key, ``to_dict``, ``from_dict``, its checks), the ORM model and so the schema, the
JSON and CSV files, and the SQL the readers run. Adding a field is one entry here and
one Alembic migration (migrations stay literal: they describe the schema of their own
revision).

The checks keep names usable as file names (``vllm-json`` export), printable in a
terminal (no control or bidi characters) and bounded in size. They are not what keeps
SQL safe: SQL only ever binds values as parameters.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Mapping
from datetime import datetime, timezone
from operator import attrgetter
from typing import Any

from spectune.messages import shorten
from spectune.space import BACKENDS, DTYPES

__all__ = [
    "DEVICE_FIELDS",
    "FIELDS",
    "KERNEL_FIELDS",
    "KEY_FIELDS",
    "LATER_FIELDS",
    "PROBLEM_FIELDS",
    "PROVENANCE_FIELDS",
    "ROW_FIELDS",
    "RUNNING_FIELDS",
    "TABLE_NAME",
    "VLLM_FIELDS",
    "VS_VLLM_VERDICTS",
    "Field",
    "check_config",
    "check_name",
    "check_text",
    "number",
    "parse_time",
    "utc",
]

#: The table of tuned configs: one column per field (and an ``id``).
TABLE_NAME = "tuned_configs"

#: Longest identity name (device, arch, kernel, versions, hashes).
NAME_MAX = 128
#: Longest free text (host, study).
TEXT_MAX = 256
#: Largest integer a row holds (the columns are 32-bit on every database).
INT_MAX = 2**31 - 1

#: What a spreadsheet takes a cell starting with for a formula (and the escape itself).
_CSV_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "'")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+\-]*\Z")
_CONFIG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: How a tuned config compared with vLLM's own function, measured side by side: what a
#: row's ``vs_vllm`` holds. The plugin serves a config in place of vLLM's function only
#: where its row says ``faster`` (for the vLLM version installed).
VS_VLLM_VERDICTS = ("faster", "not faster", "not measured")
#: The kinds of values a field holds.
KINDS = ("name", "text", "int", "float", "bool", "json", "time")


class Field:
    """One field of a tuned row: a key of its JSON object, a CSV column, a table column.

    A plain class, not a dataclass: the package is imported at every vLLM start.

    Args:
        name: The name everywhere (JSON key, CSV header, column).
        kind: ``name`` (a safe identifier-like string), ``text`` (printable text),
            ``int``, ``float``, ``bool``, ``json`` (an object or list), ``time`` (a
            timezone-aware datetime, stored as naive UTC).
        path: Where a :class:`spectune.db.TunedRow` holds it, as an attribute path
            (``device.arch``); a provenance field has the same path on a
            :class:`spectune.db.Provenance`.
        key: Part of the row's key (one row per key in a database).
        size: Longest string (``name`` and ``text``): the column's length.
        choices: The only values a ``name`` may take.
        minimum: Smallest value of an ``int``. A ``float`` of a part given ``0`` may be
            zero (a memory figure); other floats of a part are durations, never zero.
        provenance: Also a field of each history entry (who measured what, when).
        derived: Computed from other fields (stored so it can be sorted on).
        nullable: May be NULL in the table (added by a later schema revision); a
            ``json`` field then reads NULL as an empty list, any other as ``None``.
        since: The schema revision that added the column, for the fields that files
            and databases written before it may lack (they read as ``missing``).
        missing: The value of a field that ``since`` names where it is absent (an older
            file, or a database of an older revision: also the column's server default
            when not ``None``).

    Attributes:
        read: ``read(row)``, the field's value in a row (or a history entry).
        owner: The part of a row holding the field (``device``, ``problem``...), or
            ``None`` for the row's own attributes.
        attribute: The field's attribute in its owner (or in the row).
    """

    __slots__ = ("attribute", "choices", "derived", "key", "kind", "minimum", "missing",
                 "name", "nullable", "owner", "path", "provenance", "read", "since",
                 "size")  # fmt: skip

    def __init__(
        self,
        name: str,
        kind: str,
        path: str,
        *,
        key: bool = False,
        size: int | None = None,
        choices: tuple[str, ...] | None = None,
        minimum: int | None = None,
        provenance: bool = False,
        derived: bool = False,
        nullable: bool = False,
        since: str | None = None,
        missing: Any = None,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"field {name}: kind must be one of {KINDS}")
        self.name, self.kind, self.path, self.key, self.size = name, kind, path, key, size
        self.choices, self.minimum, self.provenance = choices, minimum, provenance
        self.derived, self.nullable, self.since, self.missing = derived, nullable, since, missing
        self.read = attrgetter(path)
        self.owner = path.split(".")[0] if "." in path else None
        self.attribute = path.rsplit(".", 1)[-1]

    def __repr__(self) -> str:
        return f"Field({self.name!r}, {self.kind!r}, {self.path!r})"

    def check(self, value: object) -> None:
        """Raise ``ValueError`` naming the field when ``value`` is not one it may hold.

        Checks the scalar kinds; timings, configs, times and histories are checked by
        the types holding them.
        """
        if value is None and self.nullable:
            return
        if self.kind == "name":
            if self.choices is not None:
                if value not in self.choices:
                    raise ValueError(f"{self.name} must be one of {self.choices}, got {value!r}")
            else:
                check_name(self.name, value, limit=self.size or NAME_MAX)
        elif self.kind == "text":
            check_text(self.name, value, limit=self.size or TEXT_MAX)
        elif self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int) or value < (self.minimum or 0):
                raise ValueError(
                    f"{self.name} must be an integer >= {self.minimum or 0}, got {shorten(value)}"
                )
            if value > INT_MAX:
                raise ValueError(f"{self.name} is too large, got {shorten(value)}")
        elif self.kind == "bool":
            if not isinstance(value, bool):
                raise ValueError(f"{self.name} must be a bool, got {value!r}")
        elif self.kind == "float" and not self.derived:
            value = number(self.name, value)
            if self.owner is not None and self.minimum is None:  # a duration, never zero
                if not math.isfinite(value) or value <= 0:
                    raise ValueError(f"{self.name} must be finite and positive, got {value!r}")
            elif not math.isfinite(value) or value < 0:
                raise ValueError(f"{self.name} must be finite and non-negative, got {value!r}")

    def to_plain(self, value: Any) -> Any:
        """``value`` (as :attr:`read` gives it) as a JSON value."""
        if self.kind == "time":
            return value.isoformat()
        if self.kind == "json":
            if isinstance(value, Mapping):
                return dict(value)
            return [entry.to_dict() for entry in value]
        return value

    def from_stored(self, value: Any) -> Any:
        """A value as a database returns it, as :meth:`to_plain` gives it.

        SQLite returns booleans as 0/1, times as text and JSON as text (the readers
        select it as text); PostgreSQL returns booleans and naive datetimes. Times are
        stored as naive UTC. A value of another shape is passed on for
        :meth:`spectune.db.TunedRow.from_dict` to refuse, naming the field.
        """
        if value is None:
            return [] if self.nullable and self.kind == "json" else None
        if self.kind == "bool":
            return bool(value) if type(value) is int and value in (0, 1) else value
        if self.kind == "json" and isinstance(value, (str, bytes)):
            try:
                return json.loads(value)
            except (ValueError, RecursionError):
                raise ValueError(f"{self.name} is not valid JSON") from None
        if self.kind == "time":
            if isinstance(value, str):
                try:
                    value = datetime.fromisoformat(value)
                except ValueError:
                    raise ValueError(f"{self.name} is not a time: {shorten(value)}") from None
            if isinstance(value, datetime):
                if value.tzinfo is None:
                    value = value.replace(tzinfo=timezone.utc)
                return value.isoformat()
        return value

    def to_csv(self, value: Any) -> str:
        """A JSON value (see :meth:`to_plain`) as CSV text.

        Free text that a spreadsheet would run as a formula (it starts with ``=``,
        ``+``, ``-``, ``@``, a tab or a carriage return) is written after a ``'``, the
        OWASP rule for CSV injection; so is text starting with ``'``, so that
        :meth:`from_csv` can take exactly one off again. Only ``text`` fields need it:
        names start with a letter or digit, numbers are written as numbers (a negative
        one stays one), and JSON starts with ``{`` or ``[``. ``None`` (a nullable
        field's) is an empty cell: no value such a field holds is empty text.
        """
        if value is None:
            return ""
        if self.kind == "text" and value.startswith(_CSV_FORMULA_STARTS):
            return "'" + value
        if self.kind == "json":
            return json.dumps(value, separators=(",", ":"), allow_nan=False)
        if self.kind == "bool":
            return "true" if value else "false"
        if self.kind == "float":
            return repr(float(value))
        return str(value)

    def from_csv(self, text: str) -> Any:
        """CSV text as the JSON value :meth:`to_csv` was given; ``ValueError`` if not one."""
        if text == "" and self.nullable and self.kind != "json":
            return None
        if self.kind == "int":
            if not text.strip().lstrip("-").isdigit() or len(text) > 12:
                raise ValueError(f"{self.name} must be an integer, got {shorten(text, limit=40)}")
            return int(text)
        if self.kind == "float":
            try:
                return float(text)
            except ValueError:
                raise ValueError(
                    f"{self.name} must be a number, got {shorten(text, limit=40)}"
                ) from None
        if self.kind == "json":
            try:
                return json.loads(text, parse_constant=reject_constant)
            except (ValueError, RecursionError):
                raise ValueError(f"{self.name} is not valid JSON") from None
        if self.kind == "bool":
            if text not in ("true", "false"):
                raise ValueError(
                    f"{self.name} must be true or false, got {shorten(text, limit=40)}"
                )
            return text == "true"
        if self.kind == "text" and text.startswith("'"):
            return text[1:]  # written by to_csv before text a spreadsheet would run
        return text


def _name(name: str, path: str, **options: Any) -> Field:
    return Field(name, "name", path, size=options.pop("size", NAME_MAX), **options)


def _timing(prefix: str, *, provenance: bool) -> tuple[Field, ...]:
    return tuple(
        Field(f"{prefix}_{q}_us", "float", f"{prefix}.{q}", provenance=provenance)
        for q in ("p20", "p50", "p80")
    )


#: Every field of a row, in the order of its JSON object, CSV columns and table.
ROW_FIELDS: tuple[Field, ...] = (
    _name("kernel", "kernel", key=True),
    _name("kernel_hash", "kernel_hash", key=True),
    _name("backend", "device.backend", key=True, size=32, choices=BACKENDS),
    _name("arch", "device.arch", key=True),
    _name("device_name", "device.device_name", key=True),
    Field("cu_count", "int", "device.cu_count", key=True, minimum=1),
    Field("warp_size", "int", "device.warp_size", key=True, minimum=1),
    _name("triton_version", "software.triton", key=True),
    Field("spec_len", "int", "problem.spec_len", key=True, minimum=1),
    Field("batch", "int", "problem.batch", key=True, minimum=1),
    Field("vocab", "int", "problem.vocab", key=True, minimum=1),
    _name("dtype", "problem.dtype", key=True, size=16, choices=DTYPES),
    Field("draft_probs", "bool", "problem.draft_probs", key=True),
    _name("torch_version", "software.torch"),
    _name("runtime_version", "software.runtime"),
    _name("spectune_version", "software.spectune"),
    Field("config", "json", "config", provenance=True),
    *_timing("tuned", provenance=True),
    *_timing("default", provenance=False),
    Field("speedup", "float", "speedup", derived=True),
    Field("trials", "int", "trials", minimum=0, provenance=True),
    Field("tuning_seconds", "float", "tuning_seconds", provenance=True),
    Field("tuned_at", "time", "tuned_at", provenance=True),
    Field("host", "text", "host", size=TEXT_MAX, provenance=True),
    Field("study", "text", "study", size=TEXT_MAX, provenance=True),
    # Added by schema revision 0002; NULL in rows written before it means no history.
    Field("history", "json", "history", nullable=True),
    # Added by schema revision 0004: how the config compared with vLLM's own function
    # (a :class:`spectune.db.VllmComparison`); absent in older files and databases,
    # where it reads as not measured.
    Field("vs_vllm", "name", "vllm.verdict", size=16, choices=VS_VLLM_VERDICTS,
          since="0004", missing="not measured"),
    Field("vllm_p50_us", "float", "vllm.p50_us", nullable=True, since="0004"),
    _name("vllm_version", "vllm.version", nullable=True, since="0004"),
    Field("vllm_reason", "text", "vllm.reason", size=TEXT_MAX, nullable=True, since="0004"),
    # Peak device memory of one call, MiB, of vLLM's function and of the config, measured
    # in the same comparison on a GPU (NULL under the CPU interpreter).
    Field("vllm_peak_mib", "float", "vllm.peak_mib", minimum=0, nullable=True, since="0004"),
    Field("tuned_peak_mib", "float", "vllm.tuned_peak_mib", minimum=0, nullable=True,
          since="0004"),
)  # fmt: skip

#: Every field's name, in order: the keys of a row's JSON object, the CSV header.
FIELDS = tuple(f.name for f in ROW_FIELDS)
#: The fields that make a row's identity: one row per key in a database.
KEY_FIELDS = tuple(f.name for f in ROW_FIELDS if f.key)
#: The fields of a history entry (:class:`spectune.db.Provenance`), in order.
PROVENANCE_FIELDS = tuple(f for f in ROW_FIELDS if f.provenance)
#: The device identity's fields: a row is used only on the device it names.
DEVICE_FIELDS = tuple(f for f in ROW_FIELDS if f.owner == "device")
#: The problem's fields: with the kernel, what a lookup matches.
PROBLEM_FIELDS = tuple(f for f in ROW_FIELDS if f.owner == "problem")
#: The key fields that must be the running system's for a row to be used there: the
#: device identity and the Triton version.
RUNNING_FIELDS = tuple(f for f in ROW_FIELDS if f.key and f.owner in ("device", "software"))
#: The fields files and databases written before them may lack (see ``Field.since``).
LATER_FIELDS = tuple(f for f in ROW_FIELDS if f.since is not None)
#: The fields of a row's comparison with vLLM (:class:`spectune.db.VllmComparison`).
VLLM_FIELDS = tuple(f for f in ROW_FIELDS if f.owner == "vllm")
#: The key fields naming the kernel: its family and the hash of its source.
KERNEL_FIELDS = tuple(f for f in ROW_FIELDS if f.key and f.owner is None)


def check_name(what: str, value: object, *, limit: int = NAME_MAX) -> str:
    """Return ``value`` if it is a safe identity name, else raise naming ``what``.

    Safe: 1 to ``limit`` characters of ASCII letters, digits and ``_ . + -``, starting
    with a letter or digit (so it can be part of a file name).
    """
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    if len(value) > limit or not _NAME.match(value):
        raise ValueError(
            f"{what} must be 1-{limit} characters of letters, digits, '_', '.', '+', '-' "
            f"(starting with a letter or digit), got {shorten(value)}"
        )
    return value


def check_text(what: str, value: object, *, limit: int = TEXT_MAX) -> str:
    """Return ``value`` if it is printable text of at most ``limit`` characters."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise ValueError(f"{what} must be at most {limit} characters, got {len(value)}")
    for char in value:
        if unicodedata.category(char).startswith("C"):
            raise ValueError(
                f"{what} must not contain control or format characters, got {shorten(value)}"
            )
    return value


def check_config(config: object) -> dict[str, int]:
    """A copy of ``config`` if it is a non-empty object of parameter name -> int >= 0."""
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be an object, got {type(config).__name__}")
    if not config:
        raise ValueError("config must not be empty")
    out: dict[str, int] = {}
    for key, value in config.items():
        if not isinstance(key, str) or len(key) > 64 or not _CONFIG_KEY.match(key):
            raise ValueError(f"config key must be an identifier, got {shorten(key)}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config[{key!r}] must be an integer, got {shorten(value)}")
        if value < 0:
            raise ValueError(f"config[{key!r}] must not be negative, got {value}")
        if value > INT_MAX:
            raise ValueError(f"config[{key!r}] is too large, got {value}")
        out[key] = value
    return out


def number(what: str, value: object) -> float:
    """``value``, an int or a float, as a float; ``ValueError`` naming ``what`` if not one.

    JSON integers have no bound, but a float column does: an integer too large for a
    float is refused here, not deep inside a driver.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {shorten(value)}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{what} is too large, got {shorten(value)}") from None


def utc(what: str, value: object) -> datetime:
    """``value``, a timezone-aware datetime, in UTC."""
    if not isinstance(value, datetime):
        raise ValueError(f"{what} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got {value.isoformat()}")
    return value.astimezone(timezone.utc)


def parse_time(what: str, value: object) -> datetime:
    """An ISO 8601 time with a UTC offset, as a datetime."""
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError(f"{what} must be an ISO 8601 string, got {shorten(value)}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{what} must be an ISO 8601 time, got {shorten(value)}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{what} must include a UTC offset, got {shorten(value)}")
    return parsed


def reject_constant(name: str) -> Any:
    """``json.loads``' ``parse_constant``: NaN and infinities are not JSON."""
    raise ValueError(f"{name} is not allowed")
