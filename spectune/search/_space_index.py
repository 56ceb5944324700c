"""The valid configurations of a search space, enumerated once, as a matrix of indices.

Every strategy works on this matrix: row ``i`` is one valid config, column ``j`` the
position of its value in ``space.params[j].values`` (the ordinal encoding). Proposals
are rows, so a strategy can only ever propose a valid configuration.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np
from optuna.distributions import CategoricalDistribution

from spectune.space import SearchSpace, is_power_of_two

__all__ = ["MAX_ENUMERATED", "SpaceIndex"]

#: Largest product of value-list lengths the engine enumerates.
MAX_ENUMERATED = 2_000_000


class SpaceIndex:
    """The valid configs of ``space`` as rows of an index matrix.

    Args:
        space: The search space.

    Raises:
        ValueError: naming ``space`` when it has no parameter or no valid config, or
            when its product of value lists exceeds :data:`MAX_ENUMERATED`.
    """

    def __init__(self, space: SearchSpace) -> None:
        if not space.params:
            raise ValueError("space must have at least one parameter")
        if space.cardinality() > MAX_ENUMERATED:
            raise ValueError(
                f"space has {space.cardinality()} combinations, more than the "
                f"{MAX_ENUMERATED} the engine enumerates; narrow its value lists"
            )
        self.space = space
        self.names = space.names
        self.values = tuple(p.values for p in space.params)
        self.cards = np.array([len(v) for v in self.values])
        if space.constraints:
            rows = []
            for combo in itertools.product(*(range(len(v)) for v in self.values)):
                config = {n: v[i] for n, v, i in zip(self.names, self.values, combo, strict=True)}
                if all(c.check(config) for c in space.constraints):
                    rows.append(combo)
        else:  # the full product, without a Python call per config
            mesh = np.meshgrid(*(np.arange(len(v)) for v in self.values), indexing="ij")
            rows = [tuple(r) for r in np.stack([m.ravel() for m in mesh], axis=1).tolist()]
        self.grid = np.array(rows, dtype=np.int32).reshape(len(rows), len(self.names))
        self._row = {row: i for i, row in enumerate(rows)}
        self._pos = [{v: i for i, v in enumerate(vals)} for vals in self.values]
        self.distributions = {
            n: CategoricalDistribution(list(v))
            for n, v in zip(self.names, self.values, strict=True)
        }

    def __len__(self) -> int:
        return len(self.grid)

    def row(self, config: Mapping[str, object]) -> int | None:
        """Row of ``config``, or ``None`` when it is not a valid config of the space."""
        try:
            key = tuple(pos[config[n]] for n, pos in zip(self.names, self._pos, strict=True))  # type: ignore[index]
        except (KeyError, TypeError):
            return None
        return self._row.get(key)

    def config(self, row: int) -> dict[str, int]:
        """The config of ``row``."""
        return {
            n: int(vals[i])
            for n, vals, i in zip(self.names, self.values, self.grid[row], strict=True)
        }

    def features(self, *, alignment: bool = False) -> np.ndarray:
        """Ordinal features in [0, 1] of every row, single-valued parameters dropped.

        With ``alignment``, each integer parameter whose values are positive and not all
        powers of two also gets the exponent of the largest power of two dividing its
        value (scaled to [0, 1]): GPU kernels are often fast only when a block or tile
        size is a multiple of the warp or wavefront size, and that is not a smooth
        function of the value's position in its list.
        """
        columns = self._columns(alignment=alignment)
        if not columns:
            return np.zeros((len(self.grid), 1))
        # Column-major, as the features have always been built: the GP's sums over
        # columns round in memory order, so the layout is part of its results.
        return np.stack([level[self.grid[:, j]] for j, level in columns]).T

    def plane_columns(self, *, alignment: bool = False) -> list[int]:
        """The columns of :meth:`features` (with the same ``alignment``) that belong to
        the two parameters with the most values (the first listed among equals): in
        GPU kernels usually the block sizes. Empty when no more than two parameters
        have more than one value, where those columns are nearly all there are.
        """
        multi = [j for j, _ in self._columns(alignment=False)]
        if len(multi) <= 2:
            return []
        plane = set(sorted(multi, key=lambda j: -self.cards[j])[:2])
        return [c for c, (j, _) in enumerate(self._columns(alignment=alignment)) if j in plane]

    def _columns(self, *, alignment: bool) -> list[tuple[int, np.ndarray]]:
        """The columns of :meth:`features`, in order: each one's parameter position and
        that parameter's values' levels in [0, 1]. One place for the layout, so that
        :meth:`plane_columns` cannot drift from :meth:`features`."""
        columns = [
            (j, np.arange(card) / (card - 1)) for j, card in enumerate(self.cards.tolist())
            if card > 1
        ]
        if alignment:
            columns += self._alignment_levels()
        return columns

    def _alignment_levels(self) -> list[tuple[int, np.ndarray]]:
        """The parameters that get an alignment feature (:meth:`features`), in column
        order: each one's position and its values' levels in [0, 1]."""
        levels = []
        for j, vals in enumerate(self.values):
            twos = _two_adic(vals)
            if twos is None or len(set(twos)) < 2:
                continue
            if all(is_power_of_two(v) for v in vals):  # type: ignore[arg-type]
                continue  # powers of two: the exponent is the ordinal already
            level = np.array(twos, dtype=float)
            levels.append((j, (level - level.min()) / (level.max() - level.min())))
        return levels


def _two_adic(values: tuple[object, ...]) -> list[int] | None:
    """Exponent of the largest power of two dividing each value, or ``None``."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        return None
    return [(v & -v).bit_length() - 1 for v in values]  # type: ignore[operator]
