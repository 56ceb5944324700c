"""Small spaces and objectives shared by the engine tests."""

from __future__ import annotations

from collections.abc import Mapping

from spectune.search import Outcome
from spectune.space import Constraint, Param, SearchSpace


def grid_space() -> SearchSpace:
    """Three tile-like parameters and a switch, with one constraint (~100 configs)."""
    return SearchSpace(
        params=(
            Param("block", (16, 32, 64, 128, 256), power_of_two=True),
            Param("warps", (1, 2, 4, 8), power_of_two=True),
            Param("stages", (1, 2, 3, 4)),
            Param("swizzle", (0, 1)),
        ),
        constraints=(
            Constraint("block * warps <= 1024", lambda c: c["block"] * c["warps"] <= 1024),
        ),
    )


def bowl(config: Mapping[str, int]) -> float:
    """A smooth time with a unique optimum at block=64, warps=4, stages=3, swizzle=1."""
    pos = {16: 0, 32: 1, 64: 2, 128: 3, 256: 4}[config["block"]]
    w = {1: 0, 2: 1, 4: 2, 8: 3}[config["warps"]]
    return (
        1.0
        + 0.3 * (pos - 2) ** 2
        + 0.2 * (w - 2) ** 2
        + 0.1 * (config["stages"] - 3) ** 2
        + 0.25 * (1 - config["swizzle"])
        + 0.05 * (pos - 2) * (w - 2)
    )


OPTIMUM = {"block": 64, "warps": 4, "stages": 3, "swizzle": 1}


def bowl_objective(config: Mapping[str, int]) -> Outcome:
    return Outcome.ok(bowl(config))


def tiny_space() -> SearchSpace:
    """Twelve combinations, two excluded by the constraint: ten valid configs."""
    return SearchSpace(
        params=(Param("a", (1, 2, 4), power_of_two=True), Param("b", (1, 2, 3, 4))),
        constraints=(Constraint("a * b <= 8", lambda c: c["a"] * c["b"] <= 8),),
    )
