"""The small interface the tuner, the database and the plugin see of a kernel family, and
the registry's form of it.

A registered family (:class:`RegisteredFamily`) is named, hashed and has its space
declared without importing any Triton kernel: its source hash is read from its modules'
files and its space from its ``*_space`` module. The rest (inputs, launches, references)
is the family's adapter, imported from the family's subpackage at the first call that
needs it: a vLLM worker imports the kernels it routes, and only those.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

from spectune.kernels._code_hash import code_hash
from spectune.kernels._space_parts import ProblemLimits, family_limits, rows_problem
from spectune.space import Problem, SearchSpace

__all__ = [
    "FamilyAdapter",
    "FamilySpace",
    "KernelFamily",
    "ProblemLimits",
    "RegisteredFamily",
    "RowsFamily",
    "declared_limits",
]


def declared_limits(family: object) -> ProblemLimits | None:
    """The limits ``family`` declares (its ``limits``); ``None`` when it declares none.

    Optional for a :class:`KernelFamily` (a test's family may leave them out); every
    registered family declares them (:func:`~spectune.kernels._space_parts.family_limits`).
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


class FamilySpace(Protocol):
    """What a family's ``*_space`` module (or a :class:`~spectune.kernels._space_parts.
    FoldedSpace`) declares: the space on every backend and on one, the default config,
    and the problem of a launch's shape (``problem_for``, whose arguments differ)."""

    SEARCH_SPACE: SearchSpace

    def search_space(self, backend: str) -> SearchSpace: ...

    def default_config(self, problem: Problem, backend: str) -> dict[str, int]: ...


class FamilyAdapter(Protocol):
    """The part of a :class:`KernelFamily` that needs the kernels: a family's adapter
    class (its ``*_family`` module), built by the registry with no arguments."""

    def problem_of(self, inputs: Any) -> Problem: ...

    def make_inputs(self, problem: Problem, *, seed: int, device: Any = "cpu") -> Any: ...

    def launch(self, inputs: Any, config: Mapping[str, int]) -> Any: ...

    def reference(self, inputs: Any) -> Any: ...

    def same(self, expected: Any, actual: Any) -> bool: ...


class RegisteredFamily:
    """A kernel family as :data:`spectune.kernels.FAMILIES` holds it.

    Its name, source hash, search space, default config and limits need no Triton
    kernel; its inputs, launches and references are its adapter's, imported (with the
    kernels) at the first such call. Pickled as its registration (the trial workers
    import what they run).

    Args:
        name: Registry name.
        adapter: ``"module:Class"`` of the adapter (a :class:`FamilyAdapter`).
        space: ``"module"`` declaring the space (a :class:`FamilySpace`), or
            ``"module:attribute"`` for one object of a module (a folded family's).
        source_modules: The modules the source hash covers, in order.
        package: What module names starting with ``.`` are relative to.
    """

    def __init__(
        self,
        name: str,
        *,
        adapter: str,
        space: str,
        source_modules: tuple[str, ...],
        package: str = "spectune.kernels",
    ) -> None:
        self.name = name
        self.adapter_path = _absolute(adapter, package)
        self.space_path = _absolute(space, package)
        self.source_modules = tuple(_absolute(m, package) for m in source_modules)

    @cached_property
    def source_hash(self) -> str:
        """Hash of the code of :attr:`source_modules` (read from their files)."""
        return code_hash(*self.source_modules)

    @cached_property
    def space(self) -> FamilySpace:
        """The module (or object) that declares the family's space."""
        return _resolve(self.space_path)  # type: ignore[no-any-return]

    @cached_property
    def adapter(self) -> FamilyAdapter:
        """The family's adapter (imports the family's kernels)."""
        return _resolve(self.adapter_path)()  # type: ignore[no-any-return]

    def load(self) -> None:
        """Import the adapter and the kernels now (off the hot path: the plugin's
        background prefetch), not at the first call that needs them."""
        self.adapter  # noqa: B018 (the import is the point)

    @property
    def limits(self) -> ProblemLimits:
        """The largest problem the family takes."""
        return family_limits()

    def search_space(self, backend: str) -> SearchSpace:
        """The declared launch space on ``backend``."""
        return self.space.search_space(backend)

    def default_config(self, problem: Problem, backend: str) -> dict[str, int]:
        """The launcher's config when nothing is tuned for ``problem``."""
        return self.space.default_config(problem, backend)

    def problem_of(self, inputs: Any) -> Problem:
        """The problem ``inputs`` belong to (what the launcher's default config is for)."""
        return self.adapter.problem_of(inputs)

    def make_inputs(self, problem: Problem, *, seed: int, device: Any = "cpu") -> Any:
        """Realistic inputs for ``problem``."""
        return self.adapter.make_inputs(problem, seed=seed, device=device)

    def launch(self, inputs: Any, config: Mapping[str, int]) -> Any:
        """The kernels with ``config``."""
        return self.adapter.launch(inputs, config)

    def reference(self, inputs: Any) -> Any:
        """The PyTorch reference result for ``inputs``."""
        return self.adapter.reference(inputs)

    def same(self, expected: Any, actual: Any) -> bool:
        """Whether two results agree under the family's exactness rule."""
        return self.adapter.same(expected, actual)

    def __getstate__(self) -> dict[str, Any]:
        # The registration only: modules (the space) do not pickle, and the worker
        # imports what it runs.
        return {key: self.__dict__[key]
                for key in ("name", "adapter_path", "space_path", "source_modules")}

    def __repr__(self) -> str:
        return f"RegisteredFamily({self.name!r}, adapter={self.adapter_path!r})"


class RowsFamily:
    """Adapter base of a family whose launches take one ``[rows, V]`` logits tensor (the
    sampling steps): its problem is that shape, rows as the batch."""

    def problem_of(self, inputs: Any) -> Problem:
        """The problem ``inputs`` belong to (rows as the batch, vocabulary, dtype)."""
        rows, vocab = inputs.logits.shape
        return rows_problem(num_tokens=rows, vocab=vocab, dtype=inputs.logits.dtype)


def _absolute(name: str, package: str) -> str:
    return importlib.util.resolve_name(name, package) if name.startswith(".") else name


def _resolve(path: str) -> Any:
    """The module ``path`` names, or its attribute after a ``:``."""
    module, _, attribute = path.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded
