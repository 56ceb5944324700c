"""Synthetic kernel-like tuning spaces in T4 format, to check the engine on unseen spaces.

A space has a few tile-size parameters (powers of two, or multiples of 16), small
integer knobs and on/off switches. Its log-time is a sum of smooth main effects with a
random optimum per parameter, a few pairwise interactions, a "rough" per-value term
(some values are just bad, as odd tile sizes often are) and an idiosyncratic
per-configuration term. Constraints drop part of the product; a resource rule makes
some present configurations fail (compile or run-time errors). Every configuration
gets repeated noisy runs and a compile time.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spectune.search.replay._t4 import write_t4

__all__ = ["SyntheticSpec", "make_synthetic", "write_synthetic"]


@dataclass(frozen=True)
class SyntheticSpec:
    """Knobs of a synthetic space.

    Attributes:
        tiles: Number of tile-size parameters.
        knobs: Number of small integer parameters.
        switches: Number of on/off parameters.
        interactions: Number of pairwise interaction terms.
        roughness: Scale of the per-value and per-configuration terms (log units).
        fail_fraction: Approximate share of present configurations that fail.
        noise: Coefficient of variation of repeated runs.
        runs: Repeated runs recorded per configuration.
        max_configs: Cap on present configurations (a random subset is kept).
    """

    tiles: int = 3
    knobs: int = 2
    switches: int = 2
    interactions: int = 3
    roughness: float = 0.15
    fail_fraction: float = 0.05
    noise: float = 0.02
    runs: int = 8
    max_configs: int = 6000


def make_synthetic(
    spec: SyntheticSpec, *, seed: int
) -> list[tuple[dict[str, int], float | None, list[float], float]]:
    """Rows ``(configuration, time, runtimes, compile_time)`` of a synthetic space."""
    rng = np.random.default_rng(seed)
    names: list[str] = []
    values: list[list[int]] = []
    for i in range(spec.tiles):
        names.append(f"tile_{i}")
        if rng.random() < 0.3:
            values.append([16 * k for k in range(1, int(rng.integers(6, 17)))])
        else:
            lo = int(rng.integers(0, 4))
            values.append([2**k for k in range(lo, lo + int(rng.integers(4, 8)))])
    for i in range(spec.knobs):
        names.append(f"knob_{i}")
        values.append(list(range(1, int(rng.integers(3, 9)))))
    for i in range(spec.switches):
        names.append(f"switch_{i}")
        values.append([0, 1])
    d = len(names)

    # Smooth main effects: a bowl around a random optimum in the [0, 1] position.
    centre = rng.random(d)
    width = rng.uniform(0.5, 1.5, d)
    weight = rng.uniform(0.05, 0.6, d)
    rough = [rng.normal(0.0, spec.roughness, len(v)) for v in values]
    pairs = [tuple(rng.choice(d, 2, replace=False)) for _ in range(spec.interactions)]
    pair_w = rng.normal(0.0, 0.4, spec.interactions)
    resource_w = rng.uniform(0.0, 1.0, d)

    combos = list(itertools.product(*(range(len(v)) for v in values)))
    positions = np.array(combos, dtype=float) / np.maximum([len(v) - 1 for v in values], 1)
    # Constraint: drop configurations whose two first tiles are both large.
    keep = positions[:, 0] + positions[:, min(1, d - 1)] <= 1.6
    combos = [c for c, k in zip(combos, keep, strict=True) if k]
    positions = positions[keep]
    if len(combos) > spec.max_configs:
        chosen = np.sort(rng.choice(len(combos), spec.max_configs, replace=False))
        combos = [combos[i] for i in chosen]
        positions = positions[chosen]

    logt = (weight * ((positions - centre) * width) ** 2).sum(axis=1)
    for (a, b), w in zip(pairs, pair_w, strict=True):
        logt += w * (positions[:, a] - 0.5) * (positions[:, b] - 0.5) * 4.0
    for j in range(d):
        logt += rough[j][np.array([c[j] for c in combos])]
    logt += rng.normal(0.0, spec.roughness / 2.0, len(combos))
    resource = positions @ resource_w
    fails = np.zeros(len(combos), dtype=bool)
    if spec.fail_fraction > 0:
        fails = resource >= np.quantile(resource, 1.0 - spec.fail_fraction)

    rows = []
    for combo, lt, failed in zip(combos, logt, fails, strict=True):
        config = {n: values[j][i] for j, (n, i) in enumerate(zip(names, combo, strict=True))}
        compile_ms = float(rng.uniform(300.0, 1500.0))
        if failed:
            rows.append((config, None, [], compile_ms))
            continue
        mean = float(math.exp(lt))
        runs = mean * (1.0 + spec.noise * rng.standard_normal(spec.runs))
        runs = np.maximum(runs, mean * 0.5)
        rows.append((config, float(runs.mean()), [float(x) for x in runs], compile_ms))
    return rows


def write_synthetic(path: str | Path, spec: SyntheticSpec | None = None, *, seed: int) -> Path:
    """Write a synthetic space to a T4 file; returns the path."""
    rows: Any = make_synthetic(spec or SyntheticSpec(), seed=seed)
    return write_t4(path, rows, failure="runtime")
