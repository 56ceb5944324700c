"""What every kernel family's search space and default config share.

The launch parameters Triton takes for any kernel (warps, pipelining stages, AMD's
occupancy hint), the tile and split values, the "every lane holds an element" rule, how
a default config splits vocabulary rows over programs, the space of a verification
family with the sampling parameters folded in (:class:`FoldedSpace`), and the limits of
the problems the families take. Not part of any source hash: spaces, defaults and limits
decide which configs are tried, what runs untuned and what is tuned at all, never tokens.

Imports neither torch nor Triton: the database checks tuned rows against the declared
spaces (:func:`spectune.kernels.family_space`), in processes that launch no kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from spectune.space import Constraint, Param, Problem, SearchSpace

if TYPE_CHECKING:
    import torch

__all__ = [
    "FOLD_DEFAULTS",
    "MAX_SPEC_LEN",
    "NUM_STAGES",
    "NUM_WARPS",
    "PIVOTS",
    "SPLITS",
    "TILES",
    "WAVES_PER_EU",
    "FoldedSpace",
    "ProblemLimits",
    "default_splits",
    "dtype_name",
    "family_limits",
    "folded_space",
    "lanes_constraint",
    "launch_defaults",
    "pivots_constraint",
    "rows_problem",
    "split_rows_default",
    "split_rows_space",
]

#: Most drafts per request: vLLM's own bound (``MAX_SPEC_LEN`` of
#: ``vllm.v1.sample.rejection_sampler``, which refuses a longer chain), and a chain the
#: verification kernels walk in one program (``k + 1`` tokens in one block).
MAX_SPEC_LEN = 128


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


@cache
def family_limits() -> ProblemLimits:
    """The limits every registered family declares: k as :data:`MAX_SPEC_LEN`; as many
    requests as one Triton block holds (``TRITON_MAX_TENSOR_NUMEL``, 2**20: V1
    verification holds the cumulative draft counts of the whole batch in one block,
    ``BLOCK_B``); vocabularies up to ``MAX_VOCAB``, where the fixed-point softmax
    denominator stops fitting int64 (the plugin routes no larger vocabulary to any
    family, so a config tuned past it would never be looked up). The sampling steps have
    no k (they are tuned at k = 1, whatever a sweep asks): the bound only keeps one
    sweep's ``--spec-lens`` valid for every family.

    A function, not a constant: both bounds come from modules that import Triton, which
    declaring a space does not.
    """
    from triton.language import TRITON_MAX_TENSOR_NUMEL

    from spectune.kernels.rejection.rejection_sample_constants import MAX_VOCAB

    return ProblemLimits(spec_len=MAX_SPEC_LEN, batch=TRITON_MAX_TENSOR_NUMEL, vocab=MAX_VOCAB)


#: Vocabulary tile sizes a family may take (powers of two).
TILES = (256, 512, 1024, 2048, 4096, 8192, 16384)
#: Programs one vocabulary row may be split across.
SPLITS = (1, 2, 4, 8, 16, 32, 64)

NUM_WARPS = Param("num_warps", (1, 2, 4, 8, 16), power_of_two=True, doc="warps per program")
NUM_STAGES = Param("num_stages", (1, 2, 3, 4),
                   doc="software-pipelining depth of the tile loops")
WAVES_PER_EU = Param("waves_per_eu", (0, 1, 2, 3, 4), backends=("hip",),
                     doc="AMD occupancy hint: waves per execution unit (0 = compiler's choice)")

# Defaults: Triton's 4 warps, 2 stages, the compiler's occupancy; and enough splits that
# about this many programs stream the vocabulary (a few per compute unit on a 100-300 CU
# GPU).
_DEFAULT_NUM_WARPS = 4
_DEFAULT_NUM_STAGES = 2
_DEFAULT_WAVES_PER_EU = 0
_DEFAULT_TARGET_PROGRAMS = 512


def split_rows_space(*, splits_doc: str) -> SearchSpace:
    """The space of a sampling step that splits each vocabulary row over programs: tile,
    splits (further than the verification families': vLLM launches one program per
    1024-logit tile there), warps, stages, ``waves_per_eu``; ``splits_doc`` says how the
    splits are combined."""
    return SearchSpace(
        params=(
            Param("BLOCK_V", TILES, power_of_two=True,
                  doc="vocab tile one program loads per step"),
            Param("SPLITS", (*SPLITS, 128, 256), power_of_two=True, doc=splits_doc),
            NUM_WARPS,
            NUM_STAGES,
            WAVES_PER_EU,
        ),
        constraints=(lanes_constraint("BLOCK_V"),),
    )


def split_rows_default(
    problem: Problem, backend: str, space: SearchSpace, *, block: int
) -> dict[str, int]:
    """The default config of a :func:`split_rows_space` family: tile ``block``, rows split
    by :func:`default_splits`, the shared launch defaults."""
    splits = default_splits(rows=problem.batch, vocab=problem.vocab, block=block,
                            values=space.param("SPLITS").values)
    return launch_defaults({"BLOCK_V": block, "SPLITS": splits}, space, backend)


#: The threshold search of a folded verification's pre-pass, untuned: the top-k/top-p
#: kernel's defaults.
FOLD_DEFAULTS = {"BLOCK_T": 2048, "PIVOTS": 16}
# One search pass compares a whole tile against every pivot: a PIVOTS x tile block.
_MAX_PIVOT_BLOCK = 2**17

#: Candidate thresholds each pass of the exact top-k/top-p search tests
#: (:mod:`spectune.kernels._truncation`).
PIVOTS = Param("PIVOTS", (4, 8, 16, 32, 64), power_of_two=True,
               doc="candidate thresholds one pass over the row tests (fewer passes, "
                   "more compares per logit)")


def pivots_constraint(tile: str) -> Constraint:
    """A threshold-search pass's compare block, ``PIVOTS`` x the ``tile`` parameter,
    stays within what one program holds."""
    return Constraint(f"PIVOTS * {tile} <= {_MAX_PIVOT_BLOCK}: the compare block of a pass",
                      lambda c: c["PIVOTS"] * c[tile] <= _MAX_PIVOT_BLOCK)


def folded_space(space: SearchSpace) -> SearchSpace:
    """A verification family's space with its sampling parameters folded in: the
    family's parameters plus the pre-pass's tile and pivots
    (:mod:`spectune.kernels._folding`)."""
    fold_params = (
        Param("BLOCK_T", TILES, power_of_two=True,
              doc="vocab tile of the pre-pass that finds each row's min-p and "
                  "top-k/top-p thresholds"),
        PIVOTS,
    )
    return SearchSpace(
        params=(*space.params[:-3], *fold_params, *space.params[-3:]),
        constraints=(
            *space.constraints,
            lanes_constraint("BLOCK_T"),
            pivots_constraint("BLOCK_T"),
        ),
    )


class FoldedSpace:
    """The space of a verification family with the sampling parameters folded in: the
    unfolded family's parameters plus the pre-pass's tile and pivots
    (:func:`folded_space`), its default config plus :data:`FOLD_DEFAULTS`, the same
    problems. One per folded family, beside the unfolded family's space (its ``FOLDED``),
    for the launcher (which validates a folded launch's config against it) and the
    registry (the folded family's declared space).

    Attributes:
        SEARCH_SPACE: Every launch parameter the folded kernels take, on every backend
            (named as a space module's).
        problem_for: The unfolded family's ``problem_for`` (the same shapes).
    """

    def __init__(
        self,
        space: SearchSpace,
        *,
        default_config: Callable[[Problem, str], dict[str, int]],
        problem_for: Callable[..., Problem],
    ) -> None:
        self.SEARCH_SPACE = folded_space(space)
        self.problem_for = problem_for
        self._unfolded_default = default_config

    def search_space(self, backend: str) -> SearchSpace:
        """The declared launch space on ``backend`` (``waves_per_eu`` only on HIP)."""
        return self.SEARCH_SPACE.for_backend(backend)

    def default_config(self, problem: Problem, backend: str) -> dict[str, int]:
        """The unfolded family's default for ``problem``, and the pre-pass's defaults."""
        config = {**self._unfolded_default(problem, backend), **FOLD_DEFAULTS}
        return self.search_space(backend).validate(config)


def lanes_constraint(*tiles: str) -> Constraint:
    """Every tile parameter named holds at least one element per lane of 64-wide waves."""
    names = " and ".join(f"{t} >= 64 * num_warps" for t in tiles)
    return Constraint(
        f"{names}: every lane of a 64-wide wavefront holds an element",
        lambda c: min(c[t] for t in tiles) >= 64 * c["num_warps"],
    )


def default_splits(*, rows: int, vocab: int, block: int, values: tuple[int, ...]) -> int:
    """The largest split (of ``values``) that keeps about the target number of programs
    over ``rows`` rows, and no more splits than ``block``-wide tiles of the vocabulary."""
    tiles = _cdiv(vocab, block)
    want = max(1, _cdiv(_DEFAULT_TARGET_PROGRAMS, rows))
    return max(s for s in values if s <= min(want, tiles) or s == values[0])


def launch_defaults(
    config: dict[str, int], space: SearchSpace, backend: str
) -> dict[str, int]:
    """``config`` (the family's tiles and splits) with the shared launch defaults, checked
    against ``space`` on ``backend``."""
    config = {**config, "num_warps": _DEFAULT_NUM_WARPS, "num_stages": _DEFAULT_NUM_STAGES}
    if backend == "hip":
        config["waves_per_eu"] = _DEFAULT_WAVES_PER_EU
    return space.for_backend(backend).validate(config)


def _cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive integers (``triton.cdiv``)."""
    return -(-a // b)


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype's name as a :class:`~spectune.space.Problem` spells it (``bfloat16``)."""
    return str(dtype).removeprefix("torch.")


def rows_problem(*, num_tokens: int, vocab: int, dtype: torch.dtype) -> Problem:
    """The tuning problem of a launch over ``[num_tokens, vocab]`` logits (the sampling
    steps): rows as ``batch``, vocabulary, dtype. Sampling has no speculation length:
    ``spec_len`` is 1 and ``draft_probs`` False."""
    return Problem(spec_len=1, batch=max(num_tokens, 1), vocab=vocab,
                   dtype=dtype_name(dtype), draft_probs=False)
