"""The plugin's controls: environment variables, the supported vLLM versions, its logger.

Read by every part of :mod:`spectune.vllm` (the worker hook, the routers, the doctor) and
by nothing else; imports nothing beyond the standard library, so ``register()`` stays
cheap in every vLLM process.
"""

from __future__ import annotations

import logging
import os
import re

__all__ = [
    "ENV_DISABLE",
    "ENV_FOLD",
    "ENV_FORCE",
    "ENV_RNG",
    "ENV_SAMPLING",
    "RNG_FUSED",
    "RNG_MODES",
    "RNG_VLLM",
    "SUPPORTED_VLLM",
    "disabled",
    "env_flag",
    "folding_routed",
    "forced",
    "installed_vllm_version",
    "logger",
    "rng_mode",
    "sampling_routed",
    "supported_text",
    "vllm_supported",
]

#: vLLM versions the plugin starts under: ``>= 0.32, < 0.34``. Which kernel families route
#: under each is decided at engine start against the registered seams of that release
#: (:mod:`spectune.vllm.seams`: what spectune implements there, and whether the installed
#: vLLM's sources are the registered ones).
SUPPORTED_VLLM = ((0, 32), (0, 34))
#: ``SPECTUNE_DISABLE=1``: the plugin does nothing.
ENV_DISABLE = "SPECTUNE_DISABLE"
#: ``SPECTUNE_FORCE=1``: route even with no tuned configs usable here (default configs).
ENV_FORCE = "SPECTUNE_FORCE"
#: ``SPECTUNE_RNG``: where the random inputs of sampled requests come from.
ENV_RNG = "SPECTUNE_RNG"
#: ``SPECTUNE_SAMPLING=0``: route the verification only; vLLM keeps its sampling steps.
ENV_SAMPLING = "SPECTUNE_SAMPLING"
#: ``SPECTUNE_FOLD=0``: route the sampling steps, but apply the verification's sampling
#: parameters before it (as vLLM does) instead of folding them into it.
ENV_FOLD = "SPECTUNE_FOLD"

#: Random inputs drawn exactly as vLLM draws them (seeded requests match vLLM).
RNG_VLLM = "vllm"
#: Random inputs drawn inside the kernels from one seed per request.
RNG_FUSED = "fused"
RNG_MODES = (RNG_VLLM, RNG_FUSED)

#: Under vLLM's logger tree, so the plugin's lines are printed in vLLM's format with
#: vLLM's logs.
logger = logging.getLogger("vllm.spectune")


def env_flag(name: str) -> bool:
    """Whether the environment variable ``name`` is set to something other than off."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def disabled() -> bool:
    """Whether ``SPECTUNE_DISABLE`` turns the plugin off."""
    return env_flag(ENV_DISABLE)


def forced() -> bool:
    """Whether ``SPECTUNE_FORCE`` asks for routing with default configs."""
    return env_flag(ENV_FORCE)


def sampling_routed() -> bool:
    """Whether the sampling steps are routed with the verification (``SPECTUNE_SAMPLING``
    unset or on)."""
    return ENV_SAMPLING not in os.environ or env_flag(ENV_SAMPLING)


def folding_routed() -> bool:
    """Whether the verification's sampling parameters are folded into it (the sampling
    steps routed, and ``SPECTUNE_FOLD`` unset or on)."""
    return sampling_routed() and (ENV_FOLD not in os.environ or env_flag(ENV_FOLD))


def rng_mode() -> str:
    """``SPECTUNE_RNG`` as one of :data:`RNG_MODES`; an unknown value logs and gives vLLM's."""
    value = os.environ.get(ENV_RNG, "").strip().lower() or RNG_VLLM
    if value not in RNG_MODES:
        logger.warning("spectune: %s=%r is not one of %s; using %r", ENV_RNG, value,
                       RNG_MODES, RNG_VLLM)
        value = RNG_VLLM
    return value


def vllm_supported(version: str) -> bool:
    """Whether a vLLM version string is in :data:`SUPPORTED_VLLM`."""
    match = re.match(r"(\d+)\.(\d+)", version or "")
    if match is None:
        return False
    release = (int(match.group(1)), int(match.group(2)))
    low, high = SUPPORTED_VLLM
    return low <= release < high


def supported_text() -> str:
    """:data:`SUPPORTED_VLLM` as a version specifier, for messages."""
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED_VLLM
    return f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor}"


def installed_vllm_version() -> str:
    """The installed vLLM's version (raises ``ImportError`` when vLLM is not installed)."""
    from vllm.version import __version__

    return str(__version__)
