"""The small interface the tuner, the database and the plugin see of a kernel family."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from spectune.kernels._code_hash import code_hash
from spectune.space import Problem, SearchSpace

__all__ = ["KernelFamily", "ProblemLimits", "RowsFamily", "SpaceFamily", "declared_limits"]


@dataclass(frozen=True)
class ProblemLimits:
    """The largest problem a kernel family takes, declared with its search space.

    What the tuner checks a request against before making any input: a problem past
    one of them is refused, not tuned.

    Attributes:
        spec_len: Most drafts per request (``Problem.spec_len``).
        batch: Most requests (``Problem.batch``; rows, for the sampling steps).
        vocab: Largest vocabulary (``Problem.vocab``).
    """

    spec_len: int
    batch: int
    vocab: int

    def __post_init__(self) -> None:
        for name in ("spec_len", "batch", "vocab"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ProblemLimits.{name} must be a positive integer, "
                                 f"got {value!r}")


def declared_limits(family: object) -> ProblemLimits | None:
    """The limits ``family`` declares (its ``limits``); ``None`` when it declares none.

    Optional for a :class:`KernelFamily` (a test's family may leave them out); every
    :class:`SpaceFamily` declares them in its ``*_space`` module (``LIMITS``).
    """
    limits = getattr(family, "limits", None)
    return limits if isinstance(limits, ProblemLimits) else None


@runtime_checkable
class KernelFamily(Protocol):
    """What the tuner, the database and the vLLM plugin need of a kernel family.

    Attributes:
        name: Registry name, part of every tuned row's identity.
        source_hash: Hash of the code that decides the family's results and timings (its
            kernels and launcher, see :func:`spectune.kernels._code_hash.code_hash`),
            part of every tuned row's identity.
    """

    name: str
    source_hash: str

    def search_space(self, backend: str) -> SearchSpace:
        """The tunable parameters on ``backend`` (HIP-only knobs only on ``hip``)."""
        ...

    def default_config(self, problem: Problem, backend: str) -> dict[str, int]:
        """Deterministic config used when nothing is tuned."""
        ...

    def problem_of(self, inputs: Any) -> Problem:
        """The problem a set of inputs belongs to (the shape its tuned config is for)."""
        ...

    def make_inputs(self, problem: Problem, *, seed: int, device: Any = "cpu") -> Any:
        """Realistic inputs for ``problem``."""
        ...

    def launch(self, inputs: Any, config: Mapping[str, int]) -> Any:
        """Run the Triton kernels with ``config``."""
        ...

    def reference(self, inputs: Any) -> Any:
        """The PyTorch reference result for ``inputs``."""
        ...

    def same(self, expected: Any, actual: Any) -> bool:
        """Whether two results agree under the family's exactness rule."""
        ...


class SpaceFamily:
    """What every family adapter shares: its hashed modules, and the ``*_space`` module
    that declares its search space, default config and limits.

    Subclasses set ``name``, ``source_modules`` (hashed, in order, into ``source_hash``)
    and ``space`` (a module with ``search_space(backend)``,
    ``default_config(problem, backend)`` and ``LIMITS``, a :class:`ProblemLimits`), and
    implement the rest of :class:`KernelFamily`.
    """

    name: str = ""
    source_modules: tuple[ModuleType, ...] = ()
    space: ModuleType

    def __init__(self) -> None:
        self.source_hash = code_hash(*self.source_modules)

    def search_space(self, backend: str) -> SearchSpace:
        """The declared launch space on ``backend``."""
        return self.space.search_space(backend)  # type: ignore[no-any-return]

    def default_config(self, problem: Problem, backend: str) -> dict[str, int]:
        """The launcher's config when nothing is tuned for ``problem``."""
        return self.space.default_config(problem, backend)  # type: ignore[no-any-return]

    @property
    def limits(self) -> ProblemLimits:
        """The largest problem the family takes, as its ``*_space`` module declares."""
        return self.space.LIMITS  # type: ignore[no-any-return]


class RowsFamily(SpaceFamily):
    """A family whose launches take one ``[rows, V]`` logits tensor (the sampling
    steps): its problem is that shape, rows as the batch (``space.problem_for``)."""

    def problem_of(self, inputs: Any) -> Problem:
        """The problem ``inputs`` belong to (rows as the batch, vocabulary, dtype)."""
        rows, vocab = inputs.logits.shape
        return self.space.problem_for(  # type: ignore[no-any-return]
            num_tokens=rows, vocab=vocab, dtype=inputs.logits.dtype)
