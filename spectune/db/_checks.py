"""Validators: may a stored row be used on the running system, and if not, why not.

In the spirit of PyTorch TunableOp, a row is used only where it was measured: same
device identity (backend, arch, device name, CU count, warp size), same Triton
version, same kernel source hash, and a config that belongs to the kernel's declared
search space. Torch, runtime and spectune versions are recorded but not checked.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spectune.db._errors import InvalidRowError
from spectune.db._row import TunedRow
from spectune.identity import DeviceIdentity, SoftwareIdentity
from spectune.space import InvalidConfigError, SearchSpace

__all__ = [
    "Checker",
    "SpaceLookup",
    "Spaces",
    "Verdict",
    "check_configs",
    "check_row",
    "config_problem",
]

#: ``(kernel, backend) -> SearchSpace`` or ``None`` for a kernel family not known here.
SpaceLookup = Callable[[str, str], SearchSpace | None]
#: Search spaces as callers pass them: kernel name -> space (applied with
#: ``SearchSpace.for_backend(row backend)``), or a :data:`SpaceLookup`.
Spaces = Mapping[str, SearchSpace] | SpaceLookup

_DEVICE_FIELDS = ("backend", "arch", "device_name", "cu_count", "warp_size")


@dataclass(frozen=True)
class Verdict:
    """Whether a row is usable here.

    Attributes:
        usable: True when nothing stands against it.
        reasons: Why not, one short sentence each (empty when usable).
    """

    usable: bool
    reasons: tuple[str, ...] = ()

    def describe(self) -> str:
        return "usable" if self.usable else "; ".join(self.reasons)


def space_lookup(spaces: Spaces | None) -> SpaceLookup | None:
    """Normalise ``spaces`` to a lookup; ``None`` stays ``None`` (configs not checked)."""
    if spaces is None:
        return None
    if isinstance(spaces, Mapping):
        mapping = spaces
        # for_backend builds a new space each call: build each (kernel, backend) once.
        seen: dict[tuple[str, str], SearchSpace | None] = {}

        def lookup(kernel: str, backend: str) -> SearchSpace | None:
            key = (kernel, backend)
            if key in seen:
                return seen[key]
            space = mapping.get(kernel)
            found = seen[key] = None if space is None else space.for_backend(backend)
            return found

        return lookup
    if callable(spaces):
        return spaces
    raise TypeError(
        f"spaces must be a mapping of kernel name to SearchSpace or a callable, "
        f"got {type(spaces).__name__}"
    )


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
            raise TypeError(
                f"software must be a SoftwareIdentity, got {type(software).__name__}"
            )
        if not isinstance(kernel_hashes, Mapping):
            raise TypeError("kernel_hashes must be a mapping of kernel name to source hash")
        self.device = device
        self.software = software
        self._device = tuple(getattr(device, f) for f in _DEVICE_FIELDS)
        self._hashes = dict(kernel_hashes)
        self._lookup = space_lookup(spaces)
        self._configs: dict[tuple[str, str], tuple[dict[str, int] | None, str | None]] = {}

    def reasons(
        self,
        *,
        device: tuple[Any, ...],
        triton: str,
        kernel: str,
        kernel_hash: str,
        config: Mapping[str, Any],
    ) -> tuple[str, ...]:
        """Why a row with these values is not usable here; empty when it is."""
        out = []
        if device != self._device:
            diffs = [
                f"{name} {theirs!r} (here {ours!r})"
                for name, theirs, ours in zip(_DEVICE_FIELDS, device, self._device, strict=True)
                if theirs != ours
            ]
            out.append("measured on another device: " + ", ".join(diffs))
        if triton != self.software.triton:
            out.append(f"triton {triton} (here {self.software.triton})")
        expected = self._hashes.get(kernel)
        if expected is None:
            out.append(f"kernel family {kernel!r} is not installed here")
        elif kernel_hash != expected:
            out.append(f"kernel source hash {kernel_hash} (here {expected})")
        problem = config_problem(config, kernel=kernel, backend=device[0], lookup=self._lookup)
        if problem is not None:
            out.append(problem)
        return tuple(out)

    def matches_running(self, *, device: tuple[Any, ...], triton: str) -> bool:
        """Whether a row's device identity and Triton version are the running ones."""
        return device == self._device and triton == self.software.triton

    @property
    def running_device(self) -> tuple[Any, ...]:
        """The running device's identity fields, in the order of the device columns."""
        return self._device

    @property
    def kernel_hashes(self) -> dict[str, str]:
        """Kernel family name -> source hash of the installed kernels."""
        return dict(self._hashes)

    def usable_config(self, kernel: str, text: str) -> dict[str, int] | None:
        """The parsed config of a stored row whose identity matches the running system.

        The loader's hot path (hence positional arguments): the caller has matched the
        device, Triton version and kernel hash; this parses and validates the config,
        cached per distinct (kernel, config text). ``None`` when the config is not
        usable. Never raises.
        """
        memo_key = (kernel, text)
        hit = self._configs.get(memo_key)
        if hit is None:
            try:
                config = json.loads(text)
            except (TypeError, ValueError, RecursionError):
                hit = (None, "config is not JSON")
            else:
                problem = config_problem(
                    config, kernel=kernel, backend=self._device[0], lookup=self._lookup
                )
                hit = (None, problem) if problem else (dict(config), None)
            self._configs[memo_key] = hit
        return hit[0]

    def check(self, row: TunedRow) -> Verdict:
        """The verdict on ``row``."""
        reasons = self.reasons(
            device=tuple(getattr(row.device, f) for f in _DEVICE_FIELDS),
            triton=row.software.triton,
            kernel=row.kernel,
            kernel_hash=row.kernel_hash,
            config=row.config,
        )
        return Verdict(usable=not reasons, reasons=reasons)


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
    if not isinstance(row, TunedRow):
        raise TypeError(f"row must be a TunedRow, got {type(row).__name__}")
    checker = Checker(
        device=device, software=software, kernel_hashes=kernel_hashes, spaces=spaces
    )
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
