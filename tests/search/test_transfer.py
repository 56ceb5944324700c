"""TransferStrategy: a prior's configurations on alternate turns, dropped when they miss."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from spectune.search import Outcome, Search, SpaceIndex, TransferStrategy
from spectune.search._strategies import make_strategy
from spectune.search._strategy import ProposalContext, Strategy
from tests.search.spaces import OPTIMUM, bowl, grid_space


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
    yet) and judged once the base strategy's first draw is in, the second misses too,
    and no more of them are proposed."""
    prior = _slowest(10)
    seen = _run(prior, evals=30)
    from_prior = [i for i, c in enumerate(seen) if c in prior]
    assert from_prior == [0, 2]
    assert min(bowl(c) for c in seen) == bowl(OPTIMUM)  # the search itself goes on


def test_misses_sets_how_many_failures_drop_the_prior() -> None:
    prior = _slowest(10)
    seen = _run(prior, evals=20, misses=4)
    assert [i for i, c in enumerate(seen) if c in prior] == [0, 2, 4, 6]


class _Recording(Strategy):
    """Uniform proposals that note how many evaluations each one saw."""

    name = "recording"

    def __init__(self) -> None:
        self.seen: list[int] = []

    def propose(self, ctx: ProposalContext) -> int | None:
        self.seen.append(len(ctx.history.rows))
        return int(ctx.rng.choice(np.flatnonzero(ctx.available)))


def test_the_prior_counts_towards_the_random_start() -> None:
    """With a prior that keeps hitting, the base strategy proposes from the study's
    fifth evaluation on (three from the prior, two uniform draws before it), not after
    five draws of its own."""
    index = SpaceIndex(grid_space())
    good = sorted((index.config(r) for r in range(len(index))), key=bowl)[:5]
    base = _Recording()
    strategy = TransferStrategy(base, prior=good, random_start=5)
    seen: list[dict[str, int]] = []

    def objective(config: Mapping[str, int]) -> Outcome:
        seen.append(dict(config))
        return Outcome.ok(bowl(config))

    Search(space=grid_space(), sampler=strategy, seed=2).run(objective, max_evals=10)
    assert seen[1] not in good and seen[3] not in good  # this seed's draws miss them
    assert all(seen[i] in good for i in (0, 2, 4, 6, 8))  # none of them missed
    assert base.seen == [5, 7, 9]  # turns 1 and 3 were uniform draws


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
    first = _run(prior, evals=3, storage=storage)  # prior, own draw, prior: then dropped
    second = _run(prior, evals=20, storage=storage)  # 17 more in a new session
    assert len(first) == 3 and len(second) == 17
    assert sum(c in prior for c in first + second) == 2


def test_arguments_are_checked() -> None:
    base = make_strategy("random")
    with pytest.raises(ValueError, match="misses"):
        TransferStrategy(base, prior=[], misses=0)
    with pytest.raises(ValueError, match="random_start"):
        TransferStrategy(base, prior=[], random_start=-1)
