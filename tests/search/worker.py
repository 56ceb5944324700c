"""A search worker process for the resume and multi-worker tests.

    python -m tests.search.worker STORAGE LOG --seed S --max-evals N --sleep SECONDS

Searches ``grid_space`` in the study ``shared`` of STORAGE (a JournalStorage file) and
appends one line per objective call to LOG: ``start <config>`` before, ``done <config>``
after, so a test can see which evaluations really ran (and which one a kill cut short).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import optuna

from spectune.search import Outcome, Search

from .spaces import bowl, grid_space


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("storage")
    parser.add_argument("log")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-evals", type=int, required=True)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--sampler", default="auto")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)

    def objective(config: dict[str, int]) -> Outcome:
        line = json.dumps(config, sort_keys=True)
        with open(args.log, "a") as fh:
            fh.write(f"start {os.getpid()} {line}\n")
        time.sleep(args.sleep)
        with open(args.log, "a") as fh:
            fh.write(f"done {os.getpid()} {line}\n")
        return Outcome.ok(bowl(config))

    engine = Search(
        space=grid_space(),
        storage=args.storage,
        study_name="shared",
        sampler=args.sampler,
        seed=args.seed,
    )
    result = engine.run(objective, max_evals=args.max_evals)
    print(result.stop_reason, result.new_evaluations, flush=True)


if __name__ == "__main__":
    main()
