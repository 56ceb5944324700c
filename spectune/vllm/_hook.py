"""The plugin's entry point and its worker hook: where vLLM hands spectune control.

vLLM calls :func:`register` (entry point ``spectune`` in group ``vllm.general_plugins``) in
every process it starts. It is cheap and idempotent: it checks the controls and the vLLM
version, then extends the platform's ``register_triton_kernel_overrides()`` classmethod,
which vLLM runs in each worker's ``init_worker`` right after loading plugins. Our part
(:func:`on_worker_init`) runs after the platform's own overrides (on the CPU platform
those overwrite whatever a plugin registered earlier):

1. decide whether this engine's verification can be routed (speculative decoding on,
   Triton able to run: a GPU, or ``TRITON_INTERPRET=1`` on CPU) and which runner
   verifies: Model Runner V2 (vLLM's default wherever Triton runs) or the V1 runner;
2. put a router in place of the function that runner's ``RejectionSampler`` calls:
   :class:`~spectune.vllm._mrv2_router.Mrv2Router` for
   ``vllm.v1.worker.gpu.spec_decode.rejection_sampler.rejection_sample``, or
   :class:`~spectune.vllm._v1_router.Router` for
   ``vllm.v1.sample.rejection_sampler.rejection_sample``;
3. activate it: on CPU at once; on GPUs the router activates itself at the first
   verification call (vLLM has made its device context by then; nothing here touches the
   GPU earlier). On both, a background thread imports the routed families' kernels (and
   the database layer), off vLLM's start-up path; the first launch imports whatever it
   has not.

Anything that goes wrong logs one warning and leaves vLLM as it was. Dependencies point
one way: the hook uses the routers and the settings; nothing here is imported back by
them.
"""

from __future__ import annotations

import os
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from spectune.messages import one_line
from spectune.vllm._settings import (
    ENV_DISABLE,
    disabled,
    folding_routed,
    installed_vllm_version,
    logger,
    rng_mode,
    sampling_routed,
    supported_text,
    vllm_supported,
)

if TYPE_CHECKING:
    from spectune.vllm._router import SeamRouter
    from spectune.vllm._v1_router import Router

__all__ = [
    "STATE",
    "add_sampling_companions",
    "caller_vllm_config",
    "hook_worker_init",
    "new_mrv2_router",
    "new_router",
    "on_worker_init",
    "passed_calls",
    "platform_overrides_only",
    "register",
    "routed_by_seam",
    "routed_calls",
    "uses_model_runner_v2",
    "why_not_routed",
]

_HOOK_MARK = "_spectune_worker_hook"


class _State:
    """Process-wide plugin state (a plain class: this module is imported by every vLLM
    process, and generating dataclass methods costs milliseconds).

    Attributes:
        registered: Whether :func:`register` has run in this process.
        router: The router of the engine that started last in this process.
        routers: Every router made in this process (:func:`routed_calls` adds them up).
        prefetch: The background import of the kernels and the database layer.
    """

    def __init__(self) -> None:
        self.registered = False
        self.router: SeamRouter | None = None
        self.routers: list[SeamRouter] = []
        self.prefetch: threading.Thread | None = None


STATE = _State()


def register() -> None:
    """vLLM general-plugin entry point; cheap, idempotent, never raises.

    Imports nothing heavy: the routing is set up later, in the worker.
    """
    if STATE.registered:
        return
    STATE.registered = True
    try:
        if disabled():
            logger.info("spectune: disabled by %s=1; vLLM runs unchanged", ENV_DISABLE)
            return
        version = installed_vllm_version()
        if not vllm_supported(version):
            logger.warning("spectune: vLLM %s is not supported (spectune supports %s); "
                           "vLLM runs unchanged", version, supported_text())
            return
        hook_worker_init()
        logger.debug("spectune: registered in process %d", os.getpid())
    except Exception as exc:  # never break vLLM's startup
        logger.warning("spectune: plugin not loaded (%s); vLLM runs unchanged", one_line(exc))


def routed_calls() -> int:
    """Verification calls in this process that went through spectune's kernels (the
    sampling steps routed with them: :func:`routed_by_seam`)."""
    return sum(router.stats.routed for router in STATE.routers)


def passed_calls() -> dict[str, int]:
    """Calls in this process handed to vLLM's own function, by reason: shapes whose
    row does not show spectune faster than the installed vLLM (``"no row"``, ``"vllm
    faster here"``, ``"not measured against vLLM"``), verification modes spectune does
    not implement (``"block verification"``), and sampling-step calls it does not take
    (``"apply_top_k_top_p: ..."``)."""
    counts: dict[str, int] = {}
    for router in STATE.routers:
        for each in (router, *router.companions):
            prefix = f"{each.seam}: " if each.leader is not None else ""
            for reason, n in each.stats.passed_reasons.items():
                counts[prefix + reason] = counts.get(prefix + reason, 0) + n
    return counts


def hook_worker_init() -> None:
    """Run :func:`on_worker_init` after the platform's kernel overrides, in each worker."""
    from vllm.platforms import current_platform

    platform_cls = type(current_platform)
    current = platform_cls.register_triton_kernel_overrides
    if getattr(getattr(current, "__func__", None), _HOOK_MARK, False):
        return

    def register_triton_kernel_overrides(cls: type) -> None:
        current()
        on_worker_init(caller_vllm_config(sys._getframe(1)))

    setattr(register_triton_kernel_overrides, _HOOK_MARK, True)
    register_triton_kernel_overrides.__doc__ = current.__doc__
    register_triton_kernel_overrides.__wrapped__ = current  # type: ignore[attr-defined]
    platform_cls.register_triton_kernel_overrides = classmethod(  # type: ignore[method-assign]
        register_triton_kernel_overrides
    )


def platform_overrides_only() -> None:
    """Run the platform's own ``register_triton_kernel_overrides()``, without our hook.

    For callers that need vLLM's kernels outside a worker (``spectune doctor``, tests).
    """
    from vllm.platforms import current_platform

    method = type(current_platform).register_triton_kernel_overrides
    getattr(method.__func__, "__wrapped__", method)()


def caller_vllm_config(frame: FrameType | None) -> Any:
    """The engine's ``VllmConfig``: vLLM's current one, else ``init_worker``'s argument."""
    try:
        from vllm.config import VllmConfig, get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        if config is None and frame is not None:
            config = frame.f_locals.get("vllm_config")
        return config if isinstance(config, VllmConfig) else None
    except Exception:
        return None


def new_router(module: Any, *, rng: str) -> Router:
    """A V1 router for vLLM's ``module``, counted by :func:`routed_calls`."""
    from spectune.vllm._v1_router import Router

    router = Router(module, rng=rng)
    STATE.routers.append(router)
    return router


def new_mrv2_router(module: Any) -> SeamRouter:
    """A Model Runner V2 router for vLLM's ``module``, counted by :func:`routed_calls`."""
    from spectune.vllm._mrv2_router import Mrv2Router

    router = Mrv2Router(module)
    STATE.routers.append(router)
    return router


def add_sampling_companions(router: SeamRouter, *, mrv2: bool) -> None:
    """Route the runner's sampling steps (top-k/top-p; MRV2's temperature, min-p and
    Gumbel sampling) along with its verification, and (unless ``SPECTUNE_FOLD=0``) fold
    the verification's sampling parameters into it."""
    from spectune.vllm._sampling_routers import (
        MRV2_SAMPLING_SEAMS,
        V1_SAMPLING_SEAMS,
        sampling_routers,
    )

    for companion in sampling_routers(MRV2_SAMPLING_SEAMS if mrv2 else V1_SAMPLING_SEAMS):
        router.add_companion(companion)
    if folding_routed():
        from spectune.vllm._fold_routers import V1FoldRouter, fold_router

        folder = fold_router(mrv2=mrv2)
        if folder is not None:
            router.add_companion(folder)
            if isinstance(folder, V1FoldRouter):
                router.fold = folder  # type: ignore[attr-defined]


def routed_by_seam() -> dict[str, int]:
    """Calls in this process that went through spectune's kernels, by the vLLM function
    they replaced (``module.name``): verification and sampling steps."""
    counts: dict[str, int] = {}
    for router in STATE.routers:
        for each in (router, *router.companions):
            counts[each.where] = counts.get(each.where, 0) + each.stats.routed
    return counts


def on_worker_init(vllm_config: Any, *, at_first_call: bool | None = None) -> None:
    """Decide for this engine's worker; install (or remove) the routing. Never raises.

    Args:
        vllm_config: The engine's config (``None``: unknown; V1 assumed).
        at_first_call: Identify the device and load configs at the first verification
            call instead of now; ``None`` means on GPUs (the default), not on CPU.
    """
    router: SeamRouter | None = None
    try:
        from vllm.platforms import current_platform

        if at_first_call is None:
            at_first_call = not current_platform.is_cpu()
        # A new engine in this process decides again: the previous one's router goes.
        if STATE.router is not None:
            STATE.router.uninstall()
            STATE.router = None
        if disabled():
            logger.info("spectune: disabled by %s=1; vLLM runs unchanged", ENV_DISABLE)
            return
        why_not = why_not_routed(vllm_config)
        if why_not:
            logger.info("spectune: %s; nothing routed", why_not)
            return
        if uses_model_runner_v2(vllm_config):
            import importlib

            from spectune.vllm._mrv2_router import MRV2_MODULE

            router = new_mrv2_router(importlib.import_module(MRV2_MODULE))
        else:
            import vllm.v1.sample.rejection_sampler as rs

            router = new_router(rs, rng=rng_mode())
        if sampling_routed():
            add_sampling_companions(router, mrv2=uses_model_runner_v2(vllm_config))
        # Only the families whose vLLM seams are the ones spectune implements route.
        from spectune.vllm.seams import admit

        if admit(router) is None:
            STATE.routers.remove(router)
            router = None
            return
        STATE.router = router
        router.install()
        if not at_first_call:
            import torch

            router.activate(torch.device("cpu"))
        # (At the first call, the device is identified then: before, vLLM may not have
        # selected this worker's GPU, and we create no device context of our own.)
        if router.installed:
            # The routed families' kernels (and the database layer) are imported in the
            # background, off vLLM's startup path (the model loads in the meantime); a
            # call that comes first imports what is left.
            kernels = tuple(each.kernel for each in (router, *router.companions)
                            if each.installed)
            STATE.prefetch = threading.Thread(
                target=_prefetch, args=kernels, name="spectune-prefetch", daemon=True
            )
            STATE.prefetch.start()
    except Exception as exc:
        if router is not None:
            router.uninstall()
        logger.warning("spectune: routing not set up (%s); vLLM runs unchanged", one_line(exc))


def uses_model_runner_v2(vllm_config: Any) -> bool:
    """Whether the engine verifies with Model Runner V2 (``None``: unknown, V1 assumed)."""
    return vllm_config is not None and bool(vllm_config.use_v2_model_runner)


def why_not_routed(vllm_config: Any) -> str:
    """Why this engine's verification cannot be routed; empty when it can.

    Per-call modes spectune does not implement (block verification, watermarking...)
    are not reasons here: the router hands those calls to vLLM and counts them.
    """
    from vllm.triton_utils import HAS_TRITON

    from spectune.identity import use_interpreter

    if vllm_config is not None:
        spec = vllm_config.speculative_config
        if spec is None:
            return "no speculative decoding in this engine"
        synthetic = getattr(spec, "rejection_sample_method", None) == "synthetic"
        if synthetic and not uses_model_runner_v2(vllm_config):
            return "synthetic rejection sampling (no verification kernels to route)"
    if not HAS_TRITON and not use_interpreter():
        return (
            "Triton cannot run spectune's kernels here (vLLM found no Triton GPU driver; "
            "TRITON_INTERPRET=1 runs them on CPU, slowly)"
        )
    return ""


def _prefetch(*kernels: str) -> None:
    """Import what the first verification call needs: the routed families' kernels (and
    only those), the database reader; and what loading the tuned configs asks first of
    the families and the software (their source hashes, the Triton version), so that
    the first call (on GPUs, where it loads them) does not."""
    try:
        import spectune.db  # noqa: F401
        from spectune.identity import detect_software
        from spectune.kernels import get_family, preload

        preload(*kernels)
        for name in kernels:
            get_family(name).source_hash  # noqa: B018 (computed once, then kept)
        detect_software()
    except Exception:  # the first call imports them again and reports the error
        logger.debug("spectune: prefetch failed", exc_info=True)
