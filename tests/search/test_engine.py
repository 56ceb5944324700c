"""The search engine on small spaces: optimum, failures, stop conditions, warm start."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import optuna
import pytest
from optuna.trial import TrialState

from spectune.search import Outcome, Search, SearchObserver, SpaceIndex, Status, search
from spectune.space import SearchSpace

from .spaces import OPTIMUM, bowl, bowl_objective, grid_space, tiny_space

optuna.logging.set_verbosity(optuna.logging.ERROR)


def _key(config: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(config.items()))


@pytest.mark.parametrize("sampler", ["auto", "tpe"])
@pytest.mark.parametrize("seed", [0, 1])
def test_finds_the_optimum_of_a_small_space(sampler: str, seed: int) -> None:
    space = grid_space()
    assert SpaceIndex(space).__len__() > 60
    result = search(bowl_objective, space=space, max_evals=45, sampler=sampler, seed=seed)
    assert result.best_config == OPTIMUM
    assert result.best_time == pytest.approx(bowl(OPTIMUM))
    assert result.stop_reason == "max_evals"
    assert len(result.history) == 45


def test_only_valid_configs_each_once_until_exhausted() -> None:
    space = tiny_space()
    seen = []

    def objective(config: dict[str, int]) -> Outcome:
        assert space.is_valid(config), config
        seen.append(_key(config))
        return Outcome.ok(1.0 + config["a"] + config["b"])

    result = search(objective, space=space, max_evals=100, seed=3)
    assert result.stop_reason == "exhausted"
    assert len(seen) == len(set(seen)) == space.size() == 10
    assert {_key(c) for c in space} == set(seen)
    assert len(result.history) == 10


class _StuckSampler(optuna.samplers.BaseSampler):
    """Always proposes the same (invalid) config: the engine must repair, not loop.

    A wrapped sampler proposes positions in each parameter's ordered value list: a at
    position 2 and b at 3 is the config (4, 4).
    """

    def infer_relative_search_space(self, study, trial):  # type: ignore[no-untyped-def]
        return {}

    def sample_relative(self, study, trial, search_space):  # type: ignore[no-untyped-def]
        return {}

    def sample_independent(self, study, trial, name, dist):  # type: ignore[no-untyped-def]
        return {"a": 2, "b": 3}[name]


def test_a_sampler_repeating_itself_is_repaired_and_cannot_loop() -> None:
    space = tiny_space()
    seen = []

    def objective(config: dict[str, int]) -> Outcome:
        assert space.is_valid(config), config
        seen.append(_key(config))
        return Outcome.ok(1.0)

    result = search(objective, space=space, sampler=_StuckSampler(), max_evals=50)
    assert result.stop_reason == "exhausted"
    assert len(seen) == len(set(seen)) == 10
    # The first repair is the valid config nearest to the proposal (4, 4): one value
    # differs, by the smallest ordinal step (a: 4 -> 2 is half its range; b: 4 -> 2 is
    # two thirds of its range).
    assert seen[0] == _key({"a": 2, "b": 4})


def test_failures_are_recorded_with_reason_and_never_best() -> None:
    space = grid_space()

    def objective(config: dict[str, int]) -> Outcome:
        if config["swizzle"] == 1:  # the whole better half fails to compile
            return Outcome.failed("compile", "ptxas: too many registers")
        return Outcome.ok(bowl(config))

    engine = Search(space=space, seed=0)
    result = engine.run(objective, max_evals=40)
    failed = [r for r in result.history if r.status is Status.FAIL]
    assert failed, "some swizzle=1 config must have been tried"
    assert all(r.failure == "compile" and "registers" in r.message for r in failed)
    assert result.best is not None and result.best.config["swizzle"] == 0
    assert len(result.history) == 40  # failures are charged and the search went on
    trials = {t.number: t for t in engine.study.get_trials()}
    for r in failed:
        t = trials[r.number]
        assert t.state == TrialState.FAIL
        assert t.user_attrs["spectune.failure"] == "compile"
        assert t.user_attrs["spectune.message"] == "ptxas: too many registers"
    assert engine.study.best_trial.params["swizzle"] == 0


def test_invalid_results_are_recorded_and_never_best() -> None:
    space = grid_space()

    def objective(config: dict[str, int]) -> Outcome:
        if config == OPTIMUM:
            return Outcome.invalid("differs from the reference")
        return Outcome.ok(bowl(config))

    result = search(objective, space=space, max_evals=30, warm_start=[OPTIMUM], seed=0)
    assert result.history[0].config == OPTIMUM
    assert result.history[0].status is Status.INVALID
    assert result.best is not None and result.best.config != OPTIMUM
    assert result.best.time is not None and result.best.time > bowl(OPTIMUM)


def test_objective_exceptions_are_failures_and_the_search_goes_on() -> None:
    calls = []

    def objective(config: dict[str, int]) -> Outcome:
        calls.append(config)
        if len(calls) == 2:
            raise RuntimeError("HIP error: invalid device function")
        return Outcome.ok(bowl(config))

    result = search(objective, space=grid_space(), max_evals=5, seed=0)
    assert len(result.history) == 5
    second = result.history[1]
    assert second.status is Status.FAIL and second.failure == "other"
    assert "invalid device function" in second.message


def test_warm_start_configs_are_evaluated_first_in_order() -> None:
    space = grid_space()
    warm = [
        {"block": 256, "warps": 1, "stages": 1, "swizzle": 0},
        {"block": 16, "warps": 8, "stages": 2, "swizzle": 1},
        {"block": 256, "warps": 8, "stages": 2, "swizzle": 1},  # violates the constraint
        {"block": 256, "warps": 1, "stages": 1, "swizzle": 0},  # repeated
    ]
    result = search(bowl_objective, space=space, max_evals=6, warm_start=warm, seed=0)
    configs = [r.config for r in result.history]
    assert configs[:2] == warm[:2]
    assert all(r.warm_start for r in result.history[:2])
    assert not any(r.warm_start for r in result.history[2:])
    assert warm[2] not in configs
    assert len({_key(c) for c in configs}) == 6


def test_stop_on_max_evals() -> None:
    result = search(bowl_objective, space=grid_space(), max_evals=7, seed=0)
    assert result.stop_reason == "max_evals"
    assert len(result.history) == result.new_evaluations == 7


def test_stop_on_patience() -> None:
    def objective(config: dict[str, int]) -> Outcome:
        return Outcome.ok(5.0)  # nothing ever improves on the first evaluation

    result = search(objective, space=grid_space(), patience=6, max_evals=50, seed=0)
    assert result.stop_reason == "patience"
    assert len(result.history) == 7  # the best (first) plus six without improvement


def test_stop_on_time_budget_counts_charged_costs() -> None:
    def objective(config: dict[str, int]) -> Outcome:
        return Outcome.ok(bowl(config), cost=1.0)

    result = search(objective, space=grid_space(), time_budget=5.5, max_evals=50, seed=0)
    assert result.stop_reason == "time_budget"
    assert len(result.history) == 6
    assert all(r.cost == 1.0 for r in result.history)
    assert 6.0 <= result.spent < 7.0


def test_observers_see_every_evaluation() -> None:
    events: list[tuple[str, int]] = []

    class Recorder(SearchObserver):
        def on_start(self, search, *, evaluations, max_evals):  # type: ignore[no-untyped-def]
            events.append(("start", evaluations))

        def on_trial(self, progress):  # type: ignore[no-untyped-def]
            events.append(("trial", progress.evaluations))
            assert progress.best is not None
            assert progress.best.time == min(
                r.time for r in [progress.record, progress.best] if r.time is not None
            )

        def on_stop(self, result):  # type: ignore[no-untyped-def]
            events.append(("stop", len(result.history)))

    search(bowl_objective, space=grid_space(), max_evals=4, observers=[Recorder()], seed=0)
    assert events == [
        ("start", 0),
        ("trial", 1),
        ("trial", 2),
        ("trial", 3),
        ("trial", 4),
        ("stop", 4),
    ]


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="max_evals"):
        search(bowl_objective, space=grid_space(), max_evals=0)
    with pytest.raises(ValueError, match="time_budget"):
        search(bowl_objective, space=grid_space(), time_budget=-1.0)
    with pytest.raises(ValueError, match="sampler"):
        Search(space=grid_space(), sampler="annealing")
    with pytest.raises(TypeError, match="space"):
        Search(space={"block": [16, 32]})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="failure"):
        Outcome.failed("segfault")
    with pytest.raises(ValueError, match="time"):
        Outcome.ok(float("nan"))


def test_objective_must_return_an_outcome() -> None:
    engine = Search(space=grid_space(), seed=0)
    with pytest.raises(TypeError, match="Outcome"):
        engine.run(lambda config: 1.0, max_evals=3)  # type: ignore[arg-type, return-value]
    assert engine.history() == []


def test_a_study_over_another_space_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "study.log"
    search(bowl_objective, space=grid_space(), storage=path, max_evals=2, seed=0)
    with pytest.raises(ValueError, match="different space"):
        Search(space=tiny_space(), storage=path)


def test_warm_start_outside_the_space_is_logged(caplog) -> None:  # type: ignore[no-untyped-def]
    with caplog.at_level(logging.WARNING):
        Search(space=tiny_space(), warm_start=[{"a": 4, "b": 4}])
    assert "not in the space" in caplog.text


def test_space_with_one_valid_config() -> None:
    space = SearchSpace(
        params=tiny_space().params,
        constraints=(
            tiny_space().constraints[0].__class__("only (1, 1)", lambda c: c["a"] == c["b"] == 1),
        ),
    )
    result = search(bowl_like := (lambda c: Outcome.ok(2.0)), space=space, max_evals=5)  # noqa: F841
    assert result.stop_reason == "exhausted"
    assert [r.config for r in result.history] == [{"a": 1, "b": 1}]


def test_a_strategy_of_ones_own_drives_the_search_through_the_public_interface() -> None:
    """A :class:`Strategy` written outside the package (public names only) proposes every
    configuration after its first, from the context the engine hands it; ``None`` is a
    uniform draw."""
    import numpy as np

    from spectune.search import ProposalContext, Strategy

    seen: list[int] = []

    class Lowest(Strategy):
        name = "lowest"

        def propose(self, ctx: ProposalContext) -> int | None:
            seen.append(len(ctx.history.rows))
            if not len(ctx.history.rows):
                return None  # a uniform draw
            assert not ctx.available[ctx.history.rows].any()
            return int(np.flatnonzero(ctx.available)[0])  # the first row still open

    space = grid_space()
    index = SpaceIndex(space)
    result = search(bowl_objective, space=space, sampler=Lowest(), max_evals=6, seed=0)
    assert seen == [0, 1, 2, 3, 4, 5]
    rows = [index.row(r.config) for r in result.history]
    open_rows = sorted(set(range(len(index))) - {rows[0]})
    assert rows[1:] == open_rows[:5]


def test_skipped_proposals_are_pruned_not_failed() -> None:
    """A proposal that is not evaluated (here an enqueued duplicate) ends PRUNED with its
    reason: Optuna's dashboard and ``trials_dataframe()`` count FAIL trials as failures."""
    space = tiny_space()
    engine = Search(space=space, seed=0)
    engine.run(lambda c: Outcome.ok(1.0), max_evals=2)
    done = engine.study.get_trials()[0].params
    engine.study.enqueue_trial(done)
    engine.run(lambda c: Outcome.ok(1.0), max_evals=3)
    trials = engine.study.get_trials()
    skipped = [t for t in trials if t.user_attrs.get("spectune.status") == "duplicate"]
    assert len(skipped) == 1 and skipped[0].state == TrialState.PRUNED
    states = [t.state for t in trials]
    assert states.count(TrialState.FAIL) == 0
    assert states.count(TrialState.COMPLETE) == 3


class _CountingJournal(optuna.storages.JournalStorage):
    """A real journal file storage that counts the calls the engine makes on it."""

    def __init__(self, path: str) -> None:
        super().__init__(optuna.storages.journal.JournalFileBackend(path))
        self.calls: dict[str, int] = {}

    def __getattribute__(self, name: str):  # type: ignore[no-untyped-def]
        if not name.startswith("_") and name != "calls":
            calls = object.__getattribute__(self, "calls")
            calls[name] = calls.get(name, 0) + 1
        return object.__getattribute__(self, name)


def test_a_trial_costs_few_storage_calls_on_a_shared_storage(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Each call is a round trip to the server on PostgreSQL, and the calls per trial are
    # what keep a fleet of workers from scaling: a proposal is made from the study as
    # read once, and the trial created with its parameters, owner and first heartbeat.
    storage = _CountingJournal(str(tmp_path / "studies.journal"))
    engine = Search(space=grid_space(), storage=storage, study_name="calls", seed=0)
    storage.calls.clear()
    engine.run(bowl_objective, max_evals=20)
    trials = engine.study.get_trials(deepcopy=False)
    assert len(trials) == 20 and all(t.state == TrialState.COMPLETE for t in trials)
    owners = [t.system_attrs.get("spectune.owner") for t in trials]
    assert all(isinstance(o, dict) and o.get("pid") for o in owners)
    assert all(isinstance(t.system_attrs.get("spectune.heartbeat"), float) for t in trials)
    calls = storage.calls
    assert calls.get("set_trial_param", 0) == 0, calls
    assert calls.get("create_new_trial") == 20, calls
    # The study read before each proposal and once more to admit it (plus the last look).
    assert calls.get("get_all_trials", 0) <= 2 * 20 + 3, calls
    per_trial = (sum(calls.values()) - calls.get("get_all_trials", 0)) / 20
    assert per_trial <= 6, calls
