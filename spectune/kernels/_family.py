"""The small interface the tuner, the database and the plugin see of a kernel family."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from spectune.space import Problem, SearchSpace

__all__ = ["KernelFamily"]


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
