"""What the vLLM plugin costs: at startup, and on the host per routed verification call.

Startup (goal <= 50 ms): in fresh processes, after vLLM's own imports, the time of
``register()`` plus what the worker hook adds after the platform's kernel overrides:
identify the device, load a database of ``--rows`` tuned rows (all usable here: every
row is validated and indexed, the worst case), install the routing. Reported in parts:
importing spectune's kernels, importing ``spectune.db`` (no SQLAlchemy: SQLite files are
read with ``sqlite3``), loading + routing (the worker hook, :mod:`spectune.vllm._hook`).
Twice: with the rows kept by the read cache beside the user database (every start while
the database file is unchanged), and with the file read (the first start after a tuning
run or a merge changed it).

Per call: on one process, with the router configured from that database, the host
work the plugin adds to a verification call (the per-shape config lookup and the
launch preparation: greedy mask, random inputs drawn as vLLM draws them), and a routed
call against calling ``spectune.kernels.rejection_sample`` directly with the same
prepared inputs.

    TRITON_INTERPRET=1 python benchmarks/bench_plugin.py             # CPU host
    python benchmarks/bench_plugin.py --json out.json                # on a GPU
    TRITON_INTERPRET=1 python benchmarks/bench_plugin.py --quick     # smoke run

``--quick`` (100 rows, one cold start per path, no warm-up start, a few calls, one
routed call, the calls timed in the CPU path's process) only proves that every part
runs; its figures mean nothing.

On CPU the kernels run under Triton's interpreter (milliseconds per launch), so the
routed-vs-direct difference is within noise there; the preparation figure is exact.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOAL_MS = 50.0
#: The verification call the per-call figures time: 4 requests of 3 drafts, V = 32064.
CALLS_COUNTS, CALLS_VOCAB, CALLS_K = [3, 3, 3, 3], 32064, 3
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------
# The database: --rows rows usable on this device
# --------------------------------------------------------------------------------------


def build_database(path: Path, rows: int) -> None:
    """``rows`` distinct problems measured (nominally) on this device, this software."""
    from spectune.db import TunedRow, VllmComparison, open_store
    from spectune.identity import detect_device, detect_software
    from spectune.kernels import get_family
    from spectune.promotion import Timing
    from spectune.space import Problem
    from spectune.vllm import installed_vllm_version

    device, software = detect_device(), detect_software()
    family = get_family("rejection_sample")
    configs = list(family.search_space(device.backend))
    # Every row (nominally) faster than the installed vLLM: the plugin routes only such
    # rows' shapes, and loads them all (the worst case for start-up).
    faster = VllmComparison(verdict="faster", p50_us=20.0, version=installed_vllm_version())
    problems = itertools.product(
        range(1, 11),  # k
        [2**i for i in range(10)],  # batch buckets
        [32000 + 64 * i for i in range(50)],  # vocabularies
        [True, False],  # draft probabilities
    )
    # The shape the per-call figures are measured on comes first: it must route.
    calls_shape = (CALLS_K, len(CALLS_COUNTS), CALLS_VOCAB, False)
    chosen = [calls_shape, *(p for p in problems if p != calls_shape)]
    made = []
    for i, (k, batch, vocab, draft) in enumerate(chosen[:rows]):
        made.append(TunedRow(
            device=device, software=software, kernel=family.name,
            kernel_hash=family.source_hash,
            problem=Problem(spec_len=k, batch=batch, vocab=vocab, draft_probs=draft),
            config=configs[i % len(configs)], tuned=Timing(10.0, 10.5, 11.0),
            default=Timing(14.0, 14.5, 15.0), trials=64, tuning_seconds=30.0,
            host="bench", study="bench", vllm=faster,
        ))
    if len(made) < rows:
        raise SystemExit(f"only {len(made)} distinct problems; raise the ranges")
    with open_store(path) as store:
        store.record_many(made)


# --------------------------------------------------------------------------------------
# Children
# --------------------------------------------------------------------------------------


def child_startup() -> dict[str, float]:
    """One cold start, deciding at worker init (the CPU path): imports in line."""
    import vllm.v1.sample.rejection_sampler  # noqa: F401  (vLLM's own import)
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()  # vLLM's own worker step
    ms: dict[str, float] = {}
    start = time.perf_counter()
    import spectune.vllm
    from spectune.vllm import _hook

    spectune.vllm.register()
    ms["register"] = (time.perf_counter() - start) * 1e3
    mark = time.perf_counter()
    import spectune.kernels

    ms["import_kernels"] = (time.perf_counter() - mark) * 1e3
    mark = time.perf_counter()
    import spectune.db

    ms["import_db"] = (time.perf_counter() - mark) * 1e3
    mark = time.perf_counter()
    _hook.on_worker_init(None, at_first_call=False)  # after the platform's overrides
    ms["load_and_route"] = (time.perf_counter() - mark) * 1e3
    ms["total"] = (time.perf_counter() - start) * 1e3
    router = _hook.STATE.router
    if router is None or not router.installed:
        raise SystemExit("the plugin did not route: check SPECTUNE_DB and TRITON_INTERPRET")
    # Parts of load_and_route, timed again: the database load alone, and (CPU only)
    # pointing vLLM's expand override at ours.
    from spectune.vllm._configs import TunedConfigs

    _forget_kept()
    mark = time.perf_counter()
    configs = TunedConfigs.load(families=router.families)  # as Router.activate loads
    ms["of_which_db_load"] = (time.perf_counter() - mark) * 1e3
    if configs.usable == 0:
        raise SystemExit("no usable rows loaded")
    if current_platform.is_cpu():
        router.uninstall()
        mark = time.perf_counter()
        router.route_expand()
        ms["of_which_cpu_expand_registration"] = (time.perf_counter() - mark) * 1e3
    return ms


def _forget_kept() -> None:
    """In a start that reads the database file, remove what its load kept (on a thread
    of its own), so that timing the load again reads the file again."""
    if os.environ.get("SPECTUNE_BENCH_FILE_READ") != "1":
        return
    from spectune.db._read_cache import wait_kept

    wait_kept()
    kept = Path(os.environ["SPECTUNE_USER_DB"] + ".read-cache")
    for file in kept.glob("*.rows"):
        file.unlink()


def child_startup_gpu_path() -> dict[str, float]:
    """One cold start the way GPU workers run it: the device is known at the first call.

    Worker init installs the router and starts importing the kernels and the database
    layer in the background; the first verification call identifies the device and
    loads the configs. (The expand registration is CPU-only and not part of this path.)
    """
    import vllm.v1.sample.rejection_sampler  # noqa: F401  (vLLM's own import)
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()
    ms: dict[str, float] = {}
    start = time.perf_counter()
    import spectune.vllm
    from spectune.vllm import _hook

    spectune.vllm.register()
    ms["register"] = (time.perf_counter() - start) * 1e3
    mark = time.perf_counter()
    _hook.on_worker_init(None, at_first_call=True)
    ms["worker_init"] = (time.perf_counter() - mark) * 1e3
    prefetch = _hook.STATE.prefetch
    if prefetch is None:
        raise SystemExit("no prefetch thread: the plugin did not install")
    prefetch.join()
    ms["background_imports"] = (time.perf_counter() - mark) * 1e3
    from spectune.vllm._configs import TunedConfigs

    router = _hook.STATE.router
    assert router is not None
    # What the first call does (Router.activate), less the log line and the CPU-only
    # expand step: identify the device, load the configs, configure the router.
    mark = time.perf_counter()
    configs = TunedConfigs.load(families=router.families)
    router.configure(configs)
    ms["first_call_load"] = (time.perf_counter() - mark) * 1e3
    if configs.usable == 0:
        raise SystemExit("no usable rows loaded")
    ms["critical_path_total"] = ms["register"] + ms["worker_init"] + ms["first_call_load"]
    return ms


def child_calls(calls: int, *, routed_calls: int) -> dict[str, float]:
    """Host cost per routed call, on a router configured from the database; the routed
    call against the direct one timed ``routed_calls`` times."""
    import torch
    import vllm._custom_ops  # noqa: F401
    import vllm.v1.sample.rejection_sampler as rs

    from spectune.identity import torch_device
    from spectune.kernels import get_family
    from spectune.vllm._configs import TunedConfigs
    from spectune.vllm._hook import new_router
    from spectune.vllm._settings import RNG_VLLM
    from spectune.vllm._v1_router import vllm_random_inputs
    from spectune.vllm.doctor import make_sampling_metadata

    router = new_router(rs, rng=RNG_VLLM)
    configs = TunedConfigs.load(families=router.families)
    device = torch.device(torch_device(configs.backend))
    router.configure(configs)
    family = get_family(router.kernel)
    gen = torch.Generator().manual_seed(0)
    counts, vocab, k = CALLS_COUNTS, CALLS_VOCAB, CALLS_K  # a shape the database has
    n = sum(counts)
    args = (
        torch.randint(0, vocab, (n,), generator=gen, dtype=torch.int32).to(device),
        counts, k, torch.tensor(counts).cumsum(0).to(torch.int32).to(device), None,
        (torch.randn(n, vocab, generator=gen) * 3).to(device),
        torch.randint(0, vocab, (len(counts), 1), generator=gen).to(device),
    )

    def metadata(greedy: bool) -> Any:
        temps = [0.0] * 4 if greedy else [1.0] * 4
        gens = {} if greedy else {i: torch.Generator(device=device).manual_seed(i)
                                  for i in range(4)}
        return make_sampling_metadata(temps, gens, device)

    def per_call_us(fn: Any, repeat: int) -> float:
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6

    out: dict[str, float] = {"usable_configs": float(configs.usable)}
    greedy_md, random_md = metadata(True), metadata(False)
    inputs, _ = router.prepare(*args, greedy_md)  # first call: the one database lookup
    out["config_lookup_cached_us"] = per_call_us(lambda: router.config_for(inputs), calls * 10)
    out["prepare_greedy_us"] = per_call_us(lambda: router.prepare(*args, greedy_md), calls)
    out["prepare_random_us"] = per_call_us(lambda: router.prepare(*args, random_md), calls)
    out["vllm_random_draws_us"] = per_call_us(
        lambda: vllm_random_inputs(rs, n, counts, random_md.generators, vocab, device), calls)
    out["tuned_config"] = float(router.stats.tuned_shapes)
    # The kernel wrapper's own host-side checks on every call (spectune.kernels), found
    # in the module that defines the launcher, wherever the package keeps it.
    import importlib

    from spectune.kernels import rejection_sample

    kernel_module = importlib.import_module(rejection_sample.__module__)
    inputs, config = router.prepare(*args, greedy_md)
    check = getattr(kernel_module, "_check_inputs", None)
    if check is not None:
        check_kwargs = {**_unset_keywords(check), **inputs.kwargs(), "validate": False}
        out["kernel_wrapper_checks_us"] = per_call_us(
            lambda: check(*inputs.args(), **check_kwargs), calls)
    out["kernel_wrapper_config_validation_us"] = per_call_us(
        lambda: family.search_space(configs.backend).validate(config), calls)

    # Routed call vs the kernel family launched directly with the same prepared inputs.
    routed, direct = [], []
    for _ in range(routed_calls):
        start = time.perf_counter()
        router.rejection_sample(*args, greedy_md)
        if device.type == "cuda":
            torch.cuda.synchronize()
        routed.append(time.perf_counter() - start)
        start = time.perf_counter()
        family.launch(inputs, config)
        if device.type == "cuda":
            torch.cuda.synchronize()
        direct.append(time.perf_counter() - start)
    out["routed_call_us"] = statistics.median(routed) * 1e6
    out["direct_call_us"] = statistics.median(direct) * 1e6
    return out


def _unset_keywords(function: Any) -> dict[str, None]:
    """``None`` for each keyword-only parameter of ``function`` without a default.

    The wrapper's private checks take every optional launch argument by keyword, with
    no default (the public launcher passes them all); the prepared inputs give only
    those set (a plain verification sets no sampling parameter), as the launcher's own
    defaults, ``None``, stand for the rest.
    """
    import inspect

    return {
        name: None
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind is parameter.KEYWORD_ONLY and parameter.default is parameter.empty
    }


# --------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------


def _spawn(mode: str, db: Path, calls: int, *, quick: bool = False,
           read_cache: bool = True) -> dict[str, float]:
    # The read cache lives beside the user database. A user database in a folder of its
    # own, empty, is a start that reads the database file and keeps what it read (on a
    # thread of its own), as the first start after a tuning run or merge changed it does.
    if read_cache:
        user_db = db.with_name("x.db")
    else:
        user_db = Path(tempfile.mkdtemp(dir=db.parent)) / "x.db"
    env = {**os.environ, "SPECTUNE_DB": str(db), "SPECTUNE_USER_DB": str(user_db)}
    if not read_cache:
        env["SPECTUNE_BENCH_FILE_READ"] = "1"
    for name in ("SPECTUNE_FORCE", "SPECTUNE_DISABLE", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)  # as deployed: bytecode cached (the first start writes it)
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--calls", str(calls),
         *(["--quick"] if quick else [])],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("CHILD ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"child {mode} failed:\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len("CHILD "):])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5, help="cold starts to time")
    parser.add_argument("--calls", type=int, default=200, help="calls per timing")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: --rows 100 --repeat 1 --calls 3, one routed call")
    parser.add_argument("--child", choices=("startup", "startup-gpu-path", "calls",
                                            "startup-then-calls"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeat, args.calls = 100, 1, 3
    if args.child == "startup":
        print("CHILD " + json.dumps(child_startup()), flush=True)
        return 0
    if args.child == "startup-gpu-path":
        print("CHILD " + json.dumps(child_startup_gpu_path()), flush=True)
        return 0
    routed_calls = 1 if args.quick else max(args.calls // 10, 5)
    if args.child == "calls":
        print("CHILD " + json.dumps(child_calls(args.calls, routed_calls=routed_calls)),
              flush=True)
        return 0
    if args.child == "startup-then-calls":  # --quick: one vLLM import fewer
        both = {"startup": child_startup(),
                "calls": child_calls(args.calls, routed_calls=routed_calls)}
        print("CHILD " + json.dumps(both), flush=True)
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "tuned.db"
        start = time.perf_counter()
        build_database(db, args.rows)
        print(f"built {args.rows} rows in {time.perf_counter() - start:.1f} s")
        if args.quick:
            both: Any = _spawn("startup-then-calls", db, args.calls, quick=True)
            starts, calls = [both["startup"]], both["calls"]
        else:
            _spawn("startup", db, args.calls)  # writes bytecode caches, warms the page cache
            starts = [_spawn("startup", db, args.calls) for _ in range(args.repeat)]
        lazy = [_spawn("startup-gpu-path", db, args.calls) for _ in range(args.repeat)]
        # --quick leaves these out: the same code with another environment variable.
        uncached = [_spawn("startup", db, args.calls, read_cache=False)
                    for _ in range(0 if args.quick else args.repeat)]
        lazy_uncached = [_spawn("startup-gpu-path", db, args.calls, read_cache=False)
                         for _ in range(0 if args.quick else args.repeat)]
        if not args.quick:
            calls = _spawn("calls", db, args.calls)
    figures: dict[str, dict[str, float]] = {}
    print(f"startup beyond vLLM's imports, median of {args.repeat} cold processes "
          f"({args.rows} rows usable here)")
    for name, runs, total_key, title in (
        ("startup_ms", starts, "total",
         "deciding at worker init (CPU path; all in line), rows from the read cache:"),
        ("gpu_path_startup_ms", lazy, "critical_path_total",
         "deciding at the first call (GPU path; imports in the background), "
         "rows from the read cache:"),
        ("startup_database_read_ms", uncached, "total",
         "CPU path, the database file read (first start after it changed):"),
        ("gpu_path_startup_database_read_ms", lazy_uncached, "critical_path_total",
         "GPU path, the database file read (first start after it changed):"),
    ):
        if not runs:
            continue
        median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        figures[name] = median
        print(f"  {title}")
        for key, value in median.items():
            print(f"    {key:34s} {value:8.1f} ms")
        verdict = "met" if median[total_key] <= GOAL_MS else "MISSED"
        print(f"    goal: {total_key} <= {GOAL_MS:.0f} ms: {verdict}")
    print(f"per routed call (usable configs {calls['usable_configs']:.0f}, "
          f"tuned config found: {bool(calls['tuned_config'])}):")
    for key in ("config_lookup_cached_us", "prepare_greedy_us", "prepare_random_us",
                "vllm_random_draws_us", "kernel_wrapper_checks_us",
                "kernel_wrapper_config_validation_us", "routed_call_us", "direct_call_us"):
        if key in calls:
            print(f"  {key:36s} {calls[key]:10.1f} us")
    delta = calls["routed_call_us"] - calls["direct_call_us"]
    print(f"  {'routed - direct':36s} {delta:10.1f} us (on CPU the interpreted kernel "
          "dominates: noise)")
    if args.json:
        args.json.write_text(json.dumps({**figures, "calls_us": calls}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
