"""TransferStrategy: a prior's configurations on alternate turns, dropped when they miss."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from spectune.autotune import Outcome, Search, SpaceIndex, TransferStrategy
from spectune.autotune._strategies import make_strategy
from tests.autotune.spaces import OPTIMUM, bowl, grid_space


def _run(prior: list[dict[str, int]], *, evals: int, seed: int = 3,
         storage: str | None = None, misses: int = 2) -> list[dict[str, int]]:
    seen: list[dict[str, int]] = []

    def objective(config: Mapping[str, int]) -> Outcome:
        seen.append(dict(config))
        return Outcome.ok(bowl(config))

    strategy = TransferStrategy(make_strategy("auto", seed=seed), prior=prior, misses=misses)
    Search(space=grid_space(), sampler=strategy, seed=seed, storage=storage).run(
        objective, max_evals=evals)
    return seen


def _slowest(n: int) -> list[dict[str, int]]:
    index = SpaceIndex(grid_space())
    configs = [index.config(row) for row in range(len(index))]
    return sorted(configs, key=bowl, reverse=True)[:n]


def test_a_good_prior_is_evaluated_first_and_turns_alternate() -> None:
    second = {**OPTIMUM, "stages": 2}
    seen = _run([OPTIMUM, second], evals=6)
    assert seen[0] == OPTIMUM
    assert seen[2] == second  # the base strategy's own (random) draw in between
    assert seen[1] not in (OPTIMUM, second)


def test_a_misleading_prior_is_dropped_after_two_misses() -> None:
    """The slowest configurations as the prior: the first is evaluated (nothing to beat
    yet), the next two miss, and no more of them are proposed."""
    prior = _slowest(10)
    seen = _run(prior, evals=30)
    from_prior = [i for i, c in enumerate(seen) if c in prior]
    assert from_prior == [0, 2, 4]
    assert min(bowl(c) for c in seen) == bowl(OPTIMUM)  # the search itself goes on


def test_misses_sets_how_many_failures_drop_the_prior() -> None:
    prior = _slowest(10)
    seen = _run(prior, evals=20, misses=4)
    assert [i for i, c in enumerate(seen) if c in prior] == [0, 2, 4, 6, 8]


def test_configurations_outside_the_space_are_passed_over() -> None:
    outside = {"block": 4096, "warps": 1, "stages": 1, "swizzle": 0}
    too_big = {"block": 256, "warps": 8, "stages": 1, "swizzle": 0}  # the constraint
    seen = _run([outside, too_big, OPTIMUM], evals=3)
    assert seen[0] == OPTIMUM


def test_an_empty_prior_leaves_the_base_strategy_as_it_was() -> None:
    with_empty = _run([], evals=15, seed=7)
    seen: list[dict[str, int]] = []

    def objective(config: Mapping[str, int]) -> Outcome:
        seen.append(dict(config))
        return Outcome.ok(bowl(config))

    Search(space=grid_space(), sampler=make_strategy("auto", seed=7), seed=7).run(
        objective, max_evals=15)
    assert with_empty == seen


def test_a_resumed_study_keeps_the_prior_dropped(tmp_path: Path) -> None:
    """The decisions are read from the history: a second session on the same journal
    does not start the dropped prior over."""
    storage = str(tmp_path / "study.log")
    prior = _slowest(10)
    first = _run(prior, evals=8, storage=storage)
    second = _run(prior, evals=20, storage=storage)  # 12 more in a new session
    assert len(first) == 8 and len(second) == 12
    assert sum(c in prior for c in first + second) == 3


def test_arguments_are_checked() -> None:
    base = make_strategy("random")
    with pytest.raises(ValueError, match="misses"):
        TransferStrategy(base, prior=[], misses=0)
    with pytest.raises(ValueError, match="random_start"):
        TransferStrategy(base, prior=[], random_start=-1)
