"""How every launcher turns a config (given, or the default of its launch's problem)
into the parameters its kernels are launched with.

Host code, but it decides every launch's options, so it is part of the source hash of
every family (see each ``*_family.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from spectune.identity import backend_of
from spectune.space import Problem, SearchSpace

__all__ = ["launch_config"]


def launch_config(
    config: Mapping[str, int] | None,
    device: torch.device,
    *,
    search_space: Callable[[str], SearchSpace],
    default_config: Callable[[Problem, str], dict[str, int]],
    problem: Callable[[], Problem],
) -> tuple[dict[str, int], dict[str, Any]]:
    """The config a launch on ``device`` runs with, and Triton's launch options for it.

    Args:
        config: The caller's config (checked against the family's space on the device's
            backend), or ``None`` for the default config of the launch's problem.
        device: Where the launch's tensors are.
        search_space: The family's ``search_space(backend)``.
        default_config: The family's ``default_config(problem, backend)``.
        problem: Builds the launch's problem (called only when ``config`` is ``None``).

    Returns:
        ``(config, options)``: options are ``num_warps``, ``num_stages`` and, on HIP,
        ``waves_per_eu``.

    Raises:
        spectune.space.InvalidConfigError: ``config`` is not in the family's space.
    """
    backend = backend_of(device)
    if config is None:
        chosen = default_config(problem(), backend)
    else:
        chosen = search_space(backend).validate(config)
    options: dict[str, Any] = {"num_warps": chosen["num_warps"],
                               "num_stages": chosen["num_stages"]}
    if backend == "hip":
        options["waves_per_eu"] = chosen["waves_per_eu"]
    return chosen, options
