"""Search spaces and problems: the vocabulary shared by kernels, tuner and database.

Pure Python on purpose: ``spectune.db`` validates stored configs against a kernel's
declared space without importing torch or triton.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

__all__ = [
    "BACKENDS",
    "DTYPES",
    "Constraint",
    "InvalidConfigError",
    "Param",
    "Problem",
    "SearchSpace",
    "is_power_of_two",
]

#: Backends a tuned row can name. ``cpu-interpreter`` is Triton's interpreter on CPU.
BACKENDS = ("hip", "cuda", "cpu-interpreter")
#: Logits dtypes a problem can name.
DTYPES = ("float32", "bfloat16", "float16")


class InvalidConfigError(ValueError):
    """A launch configuration does not belong to a kernel's declared search space."""


@dataclass(frozen=True)
class Param:
    """One tunable launch parameter.

    Attributes:
        name: Key of the parameter in a config mapping.
        values: The allowed values, in increasing order.
        power_of_two: Whether every value must be a power of two (tile sizes).
        backends: Backends the parameter exists on; ``None`` means all. HIP-only knobs
            such as ``waves_per_eu`` name ``("hip",)``.
        doc: What the parameter controls.
    """

    name: str
    values: tuple[int, ...]
    power_of_two: bool = False
    backends: tuple[str, ...] | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"param {self.name!r}: values must not be empty")
        if list(self.values) != sorted(set(self.values)):
            raise ValueError(f"param {self.name!r}: values must be increasing and unique")
        if self.power_of_two and any(not is_power_of_two(v) for v in self.values):
            raise ValueError(f"param {self.name!r}: every value must be a power of two")

    def applies_to(self, backend: str) -> bool:
        return self.backends is None or backend in self.backends


@dataclass(frozen=True)
class Constraint:
    """A rule joining several parameters, with the reason it exists."""

    description: str
    check: Callable[[Mapping[str, int]], bool] = field(compare=False)


@dataclass(frozen=True)
class SearchSpace:
    """The declared space of launch configurations of one kernel family.

    Attributes:
        params: The tunable parameters (all backends).
        constraints: Rules a config must satisfy besides each value being allowed.
    """

    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...] = ()

    def for_backend(self, backend: str) -> SearchSpace:
        """The space as seen on ``backend``: parameters of other backends dropped."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        return SearchSpace(
            params=tuple(p for p in self.params if p.applies_to(backend)),
            constraints=self.constraints,
        )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def validate(self, config: Mapping[str, object]) -> dict[str, int]:
        """Check ``config`` against the space and return it as a plain dict.

        Raises:
            InvalidConfigError: naming the offending key: unknown or missing keys,
                non-integer, negative, non-power-of-two or undeclared values, or a
                violated constraint.
        """
        if not isinstance(config, Mapping):
            raise InvalidConfigError(f"config must be a mapping, got {type(config).__name__}")
        unknown = sorted(set(config) - set(self.names), key=str)
        if unknown:
            raise InvalidConfigError(f"unknown config key(s) {unknown}; known: {list(self.names)}")
        missing = [n for n in self.names if n not in config]
        if missing:
            raise InvalidConfigError(f"missing config key(s) {missing}")
        out: dict[str, int] = {}
        for p in self.params:
            value = config[p.name]
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidConfigError(
                    f"config[{p.name!r}] must be an integer, got {value!r}"
                )
            if value < 0:
                raise InvalidConfigError(f"config[{p.name!r}] must not be negative, got {value}")
            if p.power_of_two and not is_power_of_two(value):
                raise InvalidConfigError(
                    f"config[{p.name!r}] must be a power of two, got {value}"
                )
            if value not in p.values:
                raise InvalidConfigError(
                    f"config[{p.name!r}]={value} is not one of {list(p.values)}"
                )
            out[p.name] = value
        for c in self.constraints:
            if not c.check(out):
                raise InvalidConfigError(f"config {out} violates: {c.description}")
        return out

    def is_valid(self, config: Mapping[str, object]) -> bool:
        try:
            self.validate(config)
        except InvalidConfigError:
            return False
        return True

    def __iter__(self) -> Iterator[dict[str, int]]:
        """Every config of the space that satisfies the constraints, in a fixed order."""
        for combo in itertools.product(*(p.values for p in self.params)):
            config = dict(zip(self.names, combo, strict=True))
            if all(c.check(config) for c in self.constraints):
                yield config

    def size(self) -> int:
        return sum(1 for _ in self)

    def cardinality(self) -> int:
        """Size of the product of the value lists, before constraints."""
        return math.prod(len(p.values) for p in self.params)


@dataclass(frozen=True)
class Problem:
    """One shape a kernel is tuned for.

    Attributes:
        spec_len: Speculation length k (drafts per request).
        batch: Number of requests.
        vocab: Vocabulary size V.
        dtype: Logits dtype name, one of :data:`DTYPES`.
        draft_probs: Whether the drafter provides probabilities.
    """

    spec_len: int
    batch: int
    vocab: int
    dtype: str = "float32"
    draft_probs: bool = True

    def __post_init__(self) -> None:
        for name in ("spec_len", "batch", "vocab"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")


def is_power_of_two(value: int) -> bool:
    """Whether ``value`` is a positive power of two."""
    return value > 0 and value & (value - 1) == 0
