"""How long the serving path takes to load tuned configs: 10,000 rows, one database.

Builds a database of ``--rows`` rows (a SQLite file, or ``--db``: an empty database,
e.g. a PostgreSQL one), all measured on one device with the running Triton version and
kernel hash (so every row is validated against a search space and indexed: the worst
case), then times :func:`spectune.db.load_index` from a new connection, ``--repeat``
times, and the per-call cost of ``ConfigIndex.lookup``.

    nice python benchmarks/bench_db_load.py            # 10,000 rows, 20 repeats
    python benchmarks/bench_db_load.py --db postgresql+psycopg://USER@HOST/EMPTY_DB

The target is <= 50 ms for 10,000 rows (median wall time); the script exits 1 above
it. CPU time and the machine's load average are printed beside it: on a shared,
loaded machine wall time measures the neighbours as much as the loader.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from spectune.db import Source, TunedRow, load_index, open_store, parse_target
from spectune.identity import DeviceIdentity, SoftwareIdentity
from spectune.promotion import Timing
from spectune.space import Param, Problem, SearchSpace

TARGET_MS = 50.0

DEVICE = DeviceIdentity(
    backend="hip", arch="gfx942", device_name="AMD_Instinct_MI300X", cu_count=304, warp_size=64
)
SOFTWARE = SoftwareIdentity(triton="3.2.0", torch="2.6.0", runtime="hip-6.2", spectune="0.1.0")
KERNEL = "rejection_sample"
KERNEL_HASH = "0123456789abcdef"
SPACE = SearchSpace(
    params=(
        Param("BLOCK_V", (256, 512, 1024, 2048, 4096), power_of_two=True),
        Param("num_warps", (1, 2, 4, 8), power_of_two=True),
        Param("num_stages", (1, 2, 3)),
        Param("waves_per_eu", (0, 1, 2, 4), backends=("hip",)),
    )
)


def make_rows(count: int) -> list[TunedRow]:
    """``count`` rows of distinct problems with configs spread over the space."""
    configs = list(SPACE.for_backend("hip"))
    problems = itertools.product(
        range(1, 33),  # k
        [2**i for i in range(12)],  # batch buckets
        [32000, 32064, 50272, 128256, 151936, 152064, 256000],
        ["float32", "bfloat16", "float16"],
        [True, False],
    )
    rows = []
    for i, (k, batch, vocab, dtype, draft) in enumerate(itertools.islice(problems, count)):
        rows.append(
            TunedRow(
                device=DEVICE,
                software=SOFTWARE,
                kernel=KERNEL,
                kernel_hash=KERNEL_HASH,
                problem=Problem(
                    spec_len=k, batch=batch, vocab=vocab, dtype=dtype, draft_probs=draft
                ),
                config=configs[i % len(configs)],
                tuned=Timing(10.0, 10.5, 11.0),
                default=Timing(14.0, 14.5, 15.0),
                trials=64,
                tuning_seconds=30.0,
                host="bench",
                study=f"bench-{i}",
            )
        )
    if len(rows) < count:
        raise SystemExit(f"only {len(rows)} distinct problems; raise the ranges")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--db", help="an empty database to fill (default: a new SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target = args.db or str(Path(tmp) / "bench.db")
        rows = make_rows(args.rows)
        with open_store(target) as store:
            store.record_many(rows)
        sources = [Source(name="bench", url=parse_target(target))]
        hashes = {KERNEL: KERNEL_HASH}
        times, cpu_times = [], []
        for _ in range(args.repeat):
            start, cpu_start = time.perf_counter(), time.process_time()
            index = load_index(
                device=DEVICE,
                software=SOFTWARE,
                kernel_hashes=hashes,
                spaces={KERNEL: SPACE},
                sources=sources,
            )
            times.append((time.perf_counter() - start) * 1e3)
            cpu_times.append((time.process_time() - cpu_start) * 1e3)
        assert len(index) == args.rows, index.describe()
        problems = [r.problem for r in rows[:1000]]
        start = time.perf_counter()
        for _ in range(100):
            for problem in problems:
                index.lookup(device=DEVICE, software=SOFTWARE, kernel=KERNEL, problem=problem)
        lookup_ns = (time.perf_counter() - start) / (100 * len(problems)) * 1e9
    median = statistics.median(times)
    print(f"rows: {args.rows}  usable: {len(index)}")
    print(
        f"load_index: median {median:.1f} ms, min {min(times):.1f} ms, "
        f"max {max(times):.1f} ms over {args.repeat} loads (target <= {TARGET_MS:.0f} ms)"
    )
    print(f"load_index CPU time: median {statistics.median(cpu_times):.1f} ms")
    print(f"lookup: {lookup_ns:.0f} ns per call")
    # Wall time on a shared machine is only meaningful beside its load.
    loads = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average (1, 5, 15 min): {loads} on {os.cpu_count()} CPUs")
    return 0 if median <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
