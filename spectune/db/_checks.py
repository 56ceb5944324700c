"""Validators: may a stored row be used on the running system, and if not, why not.

In the spirit of PyTorch TunableOp, a row is used only where it was measured: same
device identity (backend, arch, device name, CU count, warp size), same Triton
version, same kernel source hash, and a config that belongs to the kernel's declared
search space. Torch, runtime and spectune versions are recorded but not checked.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from spectune.db._fields import INT_MAX, RUNNING_FIELDS, check_config
from spectune.db.errors import InvalidRowError
from spectune.identity import DeviceIdentity, SoftwareIdentity
from spectune.space import InvalidConfigError, SearchSpace, is_power_of_two

if TYPE_CHECKING:
    from spectune.db._row import TunedRow

__all__ = [
    "Checker",
    "SpaceLookup",
    "Spaces",
    "Verdict",
    "check_configs",
    "check_row",
    "config_problem",
    "running_identity",
]

#: ``(kernel, backend) -> SearchSpace`` or ``None`` for a kernel family not known here.
SpaceLookup = Callable[[str, str], SearchSpace | None]
#: Search spaces as callers pass them: kernel name -> space (applied with
#: ``SearchSpace.for_backend(row backend)``), or a :data:`SpaceLookup`.
Spaces = Mapping[str, SearchSpace] | SpaceLookup

_RUNNING = attrgetter(*(f.path for f in RUNNING_FIELDS))


class _System(NamedTuple):
    """A running system, shaped like a row (``device``, ``software``) for field paths."""

    device: DeviceIdentity
    software: SoftwareIdentity


def running_identity(device: DeviceIdentity, software: SoftwareIdentity) -> tuple[Any, ...]:
    """The values of the running fields (device identity, Triton version) of a system."""
    return _RUNNING(_System(device, software))  # type: ignore[no-any-return]


class Verdict(NamedTuple):
    """Whether a row is usable here.

    A named tuple, not a dataclass: this module is on vLLM's worker start-up path, where
    generating dataclass methods costs milliseconds.

    Attributes:
        usable: True when nothing stands against it.
        reasons: Why not, one short sentence each (empty when usable).
    """

    usable: bool
    reasons: tuple[str, ...] = ()

    def describe(self) -> str:
        return "usable" if self.usable else "; ".join(self.reasons)


def space_lookup(spaces: Spaces | None) -> SpaceLookup | None:
    """Normalise ``spaces`` to a lookup; ``None`` stays ``None`` (configs not checked).

    The lookup asks for each ``(kernel, backend)`` once: building a space for a backend
    makes a new object each time, and a database holds many rows of one kernel family.
    """
    if spaces is None:
        return None
    if isinstance(spaces, Mapping):
        mapping = spaces

        def find(kernel: str, backend: str) -> SearchSpace | None:
            space = mapping.get(kernel)
            return None if space is None else space.for_backend(backend)

    elif callable(spaces):
        find = spaces
    else:
        raise TypeError(
            f"spaces must be a mapping of kernel name to SearchSpace or a callable, "
            f"got {type(spaces).__name__}"
        )
    seen: dict[tuple[str, str], SearchSpace | None] = {}

    def lookup(kernel: str, backend: str) -> SearchSpace | None:
        key = (kernel, backend)
        if key not in seen:
            seen[key] = find(kernel, backend)
        return seen[key]

    return lookup


def config_problem(
    config: Mapping[str, Any], *, kernel: str, backend: str, lookup: SpaceLookup | None
) -> str | None:
    """Why ``config`` is not a valid config of ``kernel`` on ``backend``, or ``None``.

    With no ``lookup`` only the shape is checked (an object of non-negative integers).
    """
    if not isinstance(config, Mapping) or not config:
        return "config is not a non-empty object"
    for key, value in config.items():
        if not isinstance(key, str):
            return f"config key {key!r} is not a string"
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"config[{key!r}] is not a non-negative integer: {value!r}"
    if lookup is None:
        return None
    return _space_problem(config, kernel=kernel, backend=backend, lookup=lookup)


def _space_problem(
    config: Mapping[str, Any], *, kernel: str, backend: str, lookup: SpaceLookup
) -> str | None:
    """Why ``config`` (of a valid shape) is not in the space of ``kernel`` on
    ``backend``, or ``None``."""
    try:
        space = lookup(kernel, backend)
    except Exception as exc:  # a caller's lookup failing makes the row unusable, no more
        return f"no search space for kernel family {kernel!r} on {backend} ({exc})"
    if space is None:
        return f"no search space for kernel family {kernel!r} on {backend}"
    try:
        space.validate(config)
    except InvalidConfigError as exc:
        return f"config not in the search space: {exc}"
    return None


class Checker:
    """Validates rows against one running system; built once, used for many rows.

    Args:
        device: The running device.
        software: The running software.
        kernel_hashes: Kernel family name -> source hash of the installed kernels.
        spaces: Search spaces of the running backend (see :data:`Spaces`); ``None``
            checks only the shape of configs.

    Attributes:
        running: The running system's values of the running fields (see
            :func:`running_identity`).
        kernel_hashes: Kernel family name -> source hash of the installed kernels.
    """

    def __init__(
        self,
        *,
        device: DeviceIdentity,
        software: SoftwareIdentity,
        kernel_hashes: Mapping[str, str],
        spaces: Spaces | None = None,
    ) -> None:
        if not isinstance(device, DeviceIdentity):
            raise TypeError(f"device must be a DeviceIdentity, got {type(device).__name__}")
        if not isinstance(software, SoftwareIdentity):
            raise TypeError(f"software must be a SoftwareIdentity, got {type(software).__name__}")
        if not isinstance(kernel_hashes, Mapping):
            raise TypeError("kernel_hashes must be a mapping of kernel name to source hash")
        self.running = running_identity(device, software)
        self.kernel_hashes = dict(kernel_hashes)
        self._backend = device.backend
        self._lookup = space_lookup(spaces)
        self._configs: dict[tuple[str, object], tuple[dict[str, int] | None, bool]] = {}
        self._members: dict[str, Callable[[object], dict[str, int] | None] | None] = {}

    def check(self, row: TunedRow) -> Verdict:
        """The verdict on ``row``."""
        found = running_identity(row.device, row.software)
        differences = [
            (f, theirs, ours)
            for f, theirs, ours in zip(RUNNING_FIELDS, found, self.running, strict=True)
            if theirs != ours
        ]
        reasons = []
        device = [f"{f.name} {theirs!r} (here {ours!r})" for f, theirs, ours in differences
                  if f.owner == "device"]  # fmt: skip
        if device:
            reasons.append("measured on another device: " + ", ".join(device))
        reasons += [f"{f.attribute} {theirs} (here {ours})" for f, theirs, ours in differences
                    if f.owner != "device"]  # fmt: skip
        expected = self.kernel_hashes.get(row.kernel)
        if expected is None:
            reasons.append(f"kernel family {row.kernel!r} is not installed here")
        elif row.kernel_hash != expected:
            reasons.append(f"kernel source hash {row.kernel_hash} (here {expected})")
        problem = config_problem(
            row.config, kernel=row.kernel, backend=row.device.backend, lookup=self._lookup
        )
        if problem is not None:
            reasons.append(problem)
        return Verdict(usable=not reasons, reasons=tuple(reasons))

    def usable_config(self, kernel: str, stored: object) -> dict[str, int] | None:
        """The config of a stored row whose identity is the running system's, if usable.

        The loader's hot path: the caller has matched the device, Triton version and
        kernel hash; this parses the config as stored (JSON text) and validates it,
        once per distinct (kernel, stored config). Never raises.
        """
        return self.stored_config(kernel, stored)[0]

    def stored_config(self, kernel: str, stored: object) -> tuple[dict[str, int] | None, bool]:
        """:meth:`usable_config`, and whether the stored config is malformed.

        Malformed: not JSON, or not a config any row may hold (what
        :class:`spectune.db.TunedRow` refuses), as opposed to a well-formed config
        outside the search space. Never raises.
        """
        memo_key = (kernel, stored)
        verdict = self._configs.get(memo_key)
        if verdict is None:
            verdict = self._configs[memo_key] = self._stored_verdict(kernel, stored)
        return verdict

    def stored_configs(
        self, kernel: str, stored: Iterable[object]
    ) -> dict[object, tuple[dict[str, int] | None, bool]]:
        """:meth:`stored_config` of each of ``stored`` (distinct stored configs), by it.

        The loader's hot path (every distinct config of a database, at every vLLM
        worker's start): a config of the space's own keys and declared values is
        accepted by a fast test (:func:`_space_member`), anything else decided by the
        full checks, which name what is wrong (the same verdicts).
        """
        member = self._member_test(kernel)
        memo = self._configs
        verdicts: dict[object, tuple[dict[str, int] | None, bool]] = {}
        for config in stored:
            verdict = memo.get((kernel, config))
            if verdict is None:
                accepted = None
                if member is not None:
                    parsed = _parse_compact(config)
                    if parsed is not _NOT_PARSED:
                        accepted = member(parsed)
                if accepted is not None:
                    verdict = (accepted, False)
                else:
                    verdict = self._stored_verdict(kernel, config)
                memo[(kernel, config)] = verdict
            verdicts[config] = verdict
        return verdicts

    def _stored_verdict(
        self, kernel: str, stored: object
    ) -> tuple[dict[str, int] | None, bool]:
        try:
            config = check_config(json.loads(stored))  # type: ignore[arg-type]
        except (TypeError, ValueError, RecursionError):
            return (None, True)
        # check_config has checked the shape config_problem would check first.
        lookup = self._lookup
        problem = None if lookup is None else _space_problem(
            config, kernel=kernel, backend=self._backend, lookup=lookup
        )
        return (None if problem else config, False)

    def _member_test(self, kernel: str) -> Callable[[object], dict[str, int] | None] | None:
        """``kernel``'s :func:`_space_member` on the running backend, built once."""
        if kernel not in self._members:
            member = None
            if self._lookup is not None:
                try:
                    space = self._lookup(kernel, self._backend)
                except Exception:  # the full check names the failure, once per config
                    space = None
                member = None if space is None else _space_member(space)
            self._members[kernel] = member
        return self._members[kernel]


def _space_member(space: SearchSpace) -> Callable[[object], dict[str, int] | None] | None:
    """A fast test that a parsed stored config is in ``space``, or ``None`` (no fast test).

    The test returns the config (a copy, as :func:`check_config` returns it) when it is a
    dict of exactly the space's keys whose values are ``int`` values the space declares
    (and :func:`check_config` accepts) and that satisfies every constraint: what
    :func:`check_config` then :meth:`SearchSpace.validate` accept. Anything else gets
    ``None``, and the full checks decide (and say why). Only for a plain
    :class:`SearchSpace`, whose ``validate`` is the one this mirrors.
    """
    if type(space) is not SearchSpace:
        return None
    names = space.names
    try:  # every key must pass check_config's key checks
        check_config(dict.fromkeys(names, 0))
    except ValueError:
        return None
    allowed = tuple(
        (p.name, frozenset(
            v for v in p.values
            if type(v) is int and 0 <= v <= INT_MAX and (is_power_of_two(v) or not p.power_of_two)
        ))
        for p in space.params
    )
    size = len(allowed)
    constraints = tuple(c.check for c in space.constraints)

    def member(config: object) -> dict[str, int] | None:
        # As many keys as the space, each of the space's: exactly the space's keys.
        if type(config) is not dict or len(config) != size:
            return None
        ordered = {}  # in the space's order, as validate passes it to the constraints
        for name, values in allowed:
            value = config.get(name)
            if type(value) is not int or value not in values:
                return None
            ordered[name] = value
        for check in constraints:
            if not check(ordered):
                return None
        return dict(config)

    return member


#: What :func:`_parse_compact` returns for text it leaves to ``json.loads``.
_NOT_PARSED = object()
#: The C scanner ``json.loads`` runs, without its Python wrappers.
_SCAN = json.JSONDecoder().scan_once


def _parse_compact(stored: object) -> object:
    """``json.loads(stored)`` for JSON text without surrounding white space (as configs
    are stored); :data:`_NOT_PARSED` for anything else (``json.loads`` decides).

    ``json.loads`` skips white space, runs this scanner from there and refuses what
    follows but white space: from the first character to the last, they agree.
    """
    if type(stored) is not str:
        return _NOT_PARSED
    try:
        value, end = _SCAN(stored, 0)
    except (StopIteration, ValueError, RecursionError):
        return _NOT_PARSED
    return value if end == len(stored) else _NOT_PARSED


def check_row(
    row: TunedRow,
    *,
    device: DeviceIdentity,
    software: SoftwareIdentity,
    kernel_hashes: Mapping[str, str],
    spaces: Spaces | None = None,
) -> Verdict:
    """Whether ``row`` may be used on the running system, and why not.

    Args:
        row: The stored row.
        device: The running device (``spectune.identity.detect_device()``).
        software: The running software (``spectune.identity.detect_software()``).
        kernel_hashes: Kernel family name -> source hash of the installed kernels.
        spaces: Search spaces (see :data:`Spaces`); ``None`` checks only config shape.
    """
    from spectune.db._row import TunedRow  # here: the serving path builds no row

    if not isinstance(row, TunedRow):
        raise TypeError(f"row must be a TunedRow, got {type(row).__name__}")
    checker = Checker(device=device, software=software, kernel_hashes=kernel_hashes, spaces=spaces)
    return checker.check(row)


def check_configs(rows: Sequence[TunedRow], *, spaces: Spaces | None, where: str) -> None:
    """Raise on the first row whose config is not in its kernel's search space.

    Args:
        rows: The rows.
        spaces: Search spaces (kernel -> space, or ``(kernel, backend) -> space``);
            ``None`` checks nothing (rows are well formed by construction).
        where: Names the rows' origin in the message.

    Raises:
        InvalidRowError: naming ``where``, the row number (from 1) and the problem.
    """
    lookup = space_lookup(spaces)
    if lookup is None:
        return
    for number, row in enumerate(rows, start=1):
        problem = config_problem(
            row.config, kernel=row.kernel, backend=row.device.backend, lookup=lookup
        )
        if problem is not None:
            raise InvalidRowError(
                f"{where}: row {number} ({row.kernel} on {row.device.device_name}): {problem}"
            )
