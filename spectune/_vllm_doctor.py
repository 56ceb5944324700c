"""``spectune doctor``'s checks: what the vLLM plugin would decide here, and a self-test.

Kept out of :mod:`spectune.vllm_plugin`, which every vLLM process imports.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from spectune._vllm_selftest import SelfTest
from spectune.vllm_plugin import (
    ENV_DISABLE,
    ENV_FORCE,
    _env_flag,
    _load_configs,
    _no_config,
    _router,
    _supported_text,
    _vllm_version,
    vllm_supported,
)

__all__ = ["Diagnosis", "diagnose", "self_test"]


@dataclass
class Diagnosis:
    """What the plugin would do in a vLLM worker started like this process.

    Attributes:
        device: Device identity, one line.
        software: Triton, torch, runtime and spectune versions.
        database: Databases read and what they hold.
        usable: Tuned configs usable on this device.
        vllm_version: Installed vLLM version (``None`` when vLLM is not installed).
        vllm_supported: Whether that version is supported.
        would_route: Whether a V1 worker would route its verification to spectune.
        reasons: Why (or why not), one line each.
    """

    device: str
    software: dict[str, object]
    database: str
    usable: int
    vllm_version: str | None
    vllm_supported: bool
    would_route: bool
    reasons: list[str] = field(default_factory=list)


def diagnose() -> Diagnosis:
    """Check what ``register()`` and a worker would decide here, without vLLM running."""
    from spectune.identity import detect_device, detect_software, use_interpreter

    identity = detect_device()
    software = detect_software()
    configs = _load_configs(identity, software)
    reasons: list[str] = []
    route = True
    version: str | None = None
    has_triton = False
    try:
        version = _vllm_version()
        from vllm.triton_utils import HAS_TRITON

        has_triton = bool(HAS_TRITON)
    except ImportError:
        pass
    supported = version is not None and vllm_supported(version)
    if _env_flag(ENV_DISABLE):
        route = False
        reasons.append(f"{ENV_DISABLE}=1: the plugin does nothing")
    if version is None:
        route = False
        reasons.append("vLLM is not installed")
    elif not supported:
        route = False
        reasons.append(f"vLLM {version} is not supported (spectune supports {_supported_text()})")
    if identity.backend == "cpu-interpreter" and not use_interpreter():
        route = False
        reasons.append("no GPU, and TRITON_INTERPRET is not set: Triton cannot run here")
    if configs.usable == 0:
        if _env_flag(ENV_FORCE):
            reasons.append(f"no tuned configs usable here; {ENV_FORCE}=1 routes with defaults")
        else:
            route = False
            reasons.append(f"no tuned configs usable here ({ENV_FORCE}=1 routes with defaults)")
    else:
        reasons.append(f"{configs.usable} tuned configs usable here")
    if route:
        reasons.append("a V1 worker with speculative decoding routes its verification")
        if has_triton and os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "") in ("", "1"):
            reasons.append(
                "vLLM picks Model Runner V2 by default where Triton works; it is not "
                "routed yet (VLLM_USE_V2_MODEL_RUNNER=0 selects the V1 runner)"
            )
    return Diagnosis(
        device=identity.describe(),
        software=software.as_dict(),
        database=configs.description,
        usable=configs.usable,
        vllm_version=version,
        vllm_supported=supported,
        would_route=route,
        reasons=reasons,
    )


def self_test() -> SelfTest:
    """Run a few verification calls through the routing, beside vLLM's own function.

    Uses this process's router (not installed into vLLM), so
    ``spectune.vllm_plugin.routed_calls()`` counts them. Needs vLLM, and Triton able to
    run (a GPU or ``TRITON_INTERPRET=1``).
    """
    import torch
    import vllm.v1.sample.rejection_sampler as rs

    from spectune._vllm_selftest import run_self_test
    from spectune.identity import detect_device

    identity = detect_device()
    device = torch.device("cpu" if identity.backend == "cpu-interpreter" else "cuda")
    router = _router(rs)
    if not router.configured:
        router.configure(_no_config, identity.backend)
    return run_self_test(router, device)
