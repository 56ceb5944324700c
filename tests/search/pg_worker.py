"""A search worker process for the fleet tests (a study shared through PostgreSQL).

    python -m tests.search.pg_worker STORAGE LOG --study NAME --max-evals N \
        [--seed S] [--sleep SECONDS] [--sampler NAME] [--stale-after S] \
        [--heartbeat-interval S] [--host NAME] [--hang-at K]

Searches ``grid_space`` in the study NAME of STORAGE (an RDB URL, or a journal file)
and appends one line per objective call to LOG: ``start PID CONFIG`` before,
``done PID CONFIG`` after, so a test can see which evaluations really ran, which one a
kill cut short, and which finished ones the study must hold. Prints the run's result as
one JSON line; the storage's retry warnings go to stderr.

``--host NAME`` runs the worker as if on another host: the host name it records as a
trial's owner, and compares owners with, is NAME. Its dead trials are then found only by
their heartbeat going stale, as those of a worker on another machine. ``--hang-at K``
makes its K-th evaluation last an hour: a test kills it there, holding a running trial.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import time

import optuna

from spectune.search import Outcome, Search

from .spaces import bowl, grid_space


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("storage")
    parser.add_argument("log")
    parser.add_argument("--study", default="shared")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-evals", type=int, required=True)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--sampler", default="random")
    parser.add_argument("--stale-after", type=float, default=600.0)
    parser.add_argument("--heartbeat-interval", type=float, default=30.0)
    parser.add_argument("--host", default=None)
    parser.add_argument("--hang-at", type=int, default=None)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    if args.host:
        # The one place a worker learns its host: socket.gethostname (worker_identity,
        # is_abandoned). Everything else is a real process on a real storage.
        socket.gethostname = lambda: args.host  # type: ignore[assignment]

    calls = 0

    def objective(config: dict[str, int]) -> Outcome:
        nonlocal calls
        calls += 1
        line = json.dumps(config, sort_keys=True)
        with open(args.log, "a") as fh:
            fh.write(f"start {os.getpid()} {line}\n")
        time.sleep(3600.0 if calls == args.hang_at else args.sleep)
        with open(args.log, "a") as fh:
            fh.write(f"done {os.getpid()} {line}\n")
        return Outcome.ok(bowl(config))

    engine = Search(
        space=grid_space(),
        storage=args.storage,
        study_name=args.study,
        sampler=args.sampler,
        seed=args.seed,
        stale_after=args.stale_after,
        heartbeat_interval=args.heartbeat_interval,
    )
    result = engine.run(objective, max_evals=args.max_evals)
    print(
        json.dumps(
            {"stop_reason": result.stop_reason, "new": result.new_evaluations,
             "pid": os.getpid()}
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
