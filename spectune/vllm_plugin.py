"""vLLM startup hook: load tuned configs in the worker and route V1 verification to spectune.

vLLM calls :func:`register` (entry point ``spectune`` in group
``vllm.general_plugins``) in every process it starts. It is cheap and idempotent: it
checks the controls and the vLLM version, then extends the platform's
``register_triton_kernel_overrides()`` classmethod, which vLLM runs in each worker's
``init_worker`` right after loading plugins. Our part runs after the platform's own
overrides (on the CPU platform those overwrite whatever a plugin registered earlier):

1. decide whether this engine's verification can be routed: speculative decoding on,
   vLLM's V1 model runner (Model Runner V2 is detected and left alone), Triton able to
   run (a GPU, or ``TRITON_INTERPRET=1`` on CPU);
2. replace ``vllm.v1.sample.rejection_sampler.rejection_sample`` (the function
   ``RejectionSampler.forward`` calls) with :class:`spectune._vllm_route.Router`'s;
3. identify the device (:mod:`spectune.identity`) and load the usable tuned configs:
   at once on CPU, at the first verification call on GPUs (vLLM has made its device
   context by then; nothing here touches the GPU earlier);
4. where vLLM's ``expand_kernel`` is a platform fallback (CPU), register a correct one
   through vLLM's ``register_kernels``.

Controls (environment, read when each worker starts):
    ``SPECTUNE_DISABLE=1``: do nothing; ``SPECTUNE_DB``: database read first (see
    :mod:`spectune.db`); ``SPECTUNE_FORCE=1``: route even with no tuned configs (default
    configs); ``SPECTUNE_RNG=fused``: draw the random inputs inside the kernels (default
    ``vllm``: drawn as vLLM draws them, so seeded requests give vLLM's tokens).

Anything that goes wrong (unknown vLLM version, unreadable database, an exception in a
routed call) logs one warning and leaves vLLM as it was.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from spectune._vllm_doctor import Diagnosis
    from spectune._vllm_route import Router
    from spectune._vllm_selftest import SelfTest
    from spectune.identity import DeviceIdentity, SoftwareIdentity
    from spectune.space import Problem

__all__ = [
    "ENV_DISABLE",
    "ENV_FORCE",
    "ENV_RNG",
    "SUPPORTED_VLLM",
    "diagnose",
    "platform_overrides_only",
    "register",
    "routed_calls",
    "self_test",
    "vllm_supported",
]

#: vLLM versions the routing is written against: ``>= 0.32, < 0.33``.
SUPPORTED_VLLM = ((0, 32), (0, 33))
ENV_DISABLE = "SPECTUNE_DISABLE"
ENV_FORCE = "SPECTUNE_FORCE"
ENV_RNG = "SPECTUNE_RNG"

#: Under vLLM's logger tree, so the line is printed in vLLM's format with vLLM's logs.
logger = logging.getLogger("vllm.spectune")

_HOOK_MARK = "_spectune_worker_hook"
_KERNEL = "rejection_sample"


class _State:
    """Process-wide plugin state (plain classes here: this module is imported by every
    vLLM process, and generating dataclass methods costs milliseconds)."""

    def __init__(self) -> None:
        self.registered = False
        self.router: Router | None = None
        self.prefetch: threading.Thread | None = None


_STATE = _State()


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def register() -> None:
    """vLLM general-plugin entry point; cheap, idempotent, never raises.

    Imports nothing heavy: the routing is set up later, in the worker.
    """
    if _STATE.registered:
        return
    _STATE.registered = True
    try:
        if _env_flag(ENV_DISABLE):
            logger.info("spectune: disabled by %s=1; vLLM runs unchanged", ENV_DISABLE)
            return
        version = _vllm_version()
        if not vllm_supported(version):
            logger.warning(
                "spectune: vLLM %s is not supported (spectune supports %s); "
                "vLLM runs unchanged", version, _supported_text(),
            )
            return
        _hook_worker_init()
        logger.debug("spectune: registered in process %d", os.getpid())
    except Exception as exc:  # never break vLLM's startup
        logger.warning("spectune: plugin not loaded (%s); vLLM runs unchanged", _one_line(exc))


def routed_calls() -> int:
    """Verification calls in this process that went through spectune's kernels."""
    router = _STATE.router
    return 0 if router is None else router.stats.routed


def vllm_supported(version: str) -> bool:
    """Whether a vLLM version string is in :data:`SUPPORTED_VLLM`."""
    match = re.match(r"(\d+)\.(\d+)", version or "")
    if match is None:
        return False
    release = (int(match.group(1)), int(match.group(2)))
    low, high = SUPPORTED_VLLM
    return low <= release < high


# --------------------------------------------------------------------------------------
# Worker
# --------------------------------------------------------------------------------------


def _hook_worker_init() -> None:
    """Run :func:`_on_worker_init` after the platform's kernel overrides, in each worker."""
    from vllm.platforms import current_platform

    platform_cls = type(current_platform)
    current = platform_cls.register_triton_kernel_overrides
    if getattr(getattr(current, "__func__", None), _HOOK_MARK, False):
        return

    def register_triton_kernel_overrides(cls: type) -> None:
        current()
        _on_worker_init(_caller_vllm_config(sys._getframe(1)))

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


def _caller_vllm_config(frame: FrameType | None) -> Any:
    """The engine's ``VllmConfig``: vLLM's current one, else ``init_worker``'s argument."""
    try:
        from vllm.config import VllmConfig, get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        if config is None and frame is not None:
            config = frame.f_locals.get("vllm_config")
        return config if isinstance(config, VllmConfig) else None
    except Exception:
        return None


def _on_worker_init(vllm_config: Any, *, at_first_call: bool | None = None) -> None:
    """Decide for this engine's worker; install (or remove) the routing. Never raises.

    Args:
        vllm_config: The engine's config (``None``: unknown; V1 assumed).
        at_first_call: Identify the device and load configs at the first verification
            call instead of now; ``None`` means on GPUs (the default), not on CPU.
    """
    router = None
    try:
        import vllm.v1.sample.rejection_sampler as rs
        from vllm.platforms import current_platform

        if at_first_call is None:
            at_first_call = not current_platform.is_cpu()
        router = _router(rs)
        router.reset()
        if _env_flag(ENV_DISABLE):
            _uninstall(router)
            logger.info("spectune: disabled by %s=1; vLLM runs unchanged", ENV_DISABLE)
            return
        why_not = _why_not_v1(vllm_config)
        if why_not:
            _uninstall(router)
            logger.info("spectune: %s; nothing routed", why_not)
            return
        router.rng = _rng_mode()
        router.install()
        if at_first_call:
            # The device is identified at the first call: before that, vLLM may not have
            # selected this worker's GPU, and we create no device context of our own.
            # Meanwhile the kernels and the database layer are imported in the
            # background, off vLLM's startup path (the model loads in the meantime).
            router.on_first_call = _decide
            _STATE.prefetch = threading.Thread(
                target=_prefetch, name="spectune-prefetch", daemon=True
            )
            _STATE.prefetch.start()
        else:
            import torch

            _decide(router, torch.device("cpu"))
    except Exception as exc:
        if router is not None:
            _uninstall(router)
        logger.warning("spectune: routing not set up (%s); vLLM runs unchanged",
                       _one_line(exc))


def _prefetch() -> None:
    """Import what the first verification call needs: kernels, database reader."""
    try:
        import spectune.db
        import spectune.kernels  # noqa: F401
    except Exception:  # the first call imports them again and reports the error
        logger.debug("spectune: prefetch failed", exc_info=True)


def _router(module: Any) -> Router:
    from spectune._vllm_route import Router

    router = _STATE.router
    if router is None or router.module is not module:
        router = Router(module=module, on_error=_on_routed_error)
        _STATE.router = router
    return router


def _uninstall(router: Router) -> None:
    from vllm.triton_utils import dispatcher

    router.uninstall(dispatcher)


def _on_routed_error(exc: BaseException) -> None:
    router = _STATE.router
    if router is not None:
        try:
            _uninstall(router)
        except Exception:
            logger.debug("spectune: uninstall failed", exc_info=True)
    logger.warning(
        "spectune: a routed verification call failed (%s: %s); vLLM's own kernels are used "
        "from now on", type(exc).__name__, _one_line(exc),
    )


def _why_not_v1(vllm_config: Any) -> str:
    """Why this engine's V1 verification cannot be routed; empty when it can."""
    from vllm.triton_utils import HAS_TRITON

    from spectune.identity import use_interpreter

    if vllm_config is not None:
        spec = vllm_config.speculative_config
        if spec is None:
            return "no speculative decoding in this engine"
        if getattr(spec, "rejection_sample_method", None) == "synthetic":
            return "synthetic rejection sampling (no verification kernels to route)"
        if vllm_config.use_v2_model_runner:
            return (
                "Model Runner V2 in use: its verification (vllm/v1/worker/gpu/spec_decode) "
                "is not routed yet (VLLM_USE_V2_MODEL_RUNNER=0 selects the V1 runner)"
            )
    if not HAS_TRITON and not use_interpreter():
        return (
            "Triton cannot run spectune's kernels here (vLLM found no Triton GPU driver; "
            "TRITON_INTERPRET=1 runs them on CPU, slowly)"
        )
    return ""


def _rng_mode() -> str:
    from spectune._vllm_route import RNG_MODES, RNG_VLLM

    value = os.environ.get(ENV_RNG, "").strip().lower() or RNG_VLLM
    if value not in RNG_MODES:
        logger.warning("spectune: %s=%r is not one of %s; using %r", ENV_RNG, value,
                       RNG_MODES, RNG_VLLM)
        value = RNG_VLLM
    return value


def _decide(router: Router, device: torch.device) -> None:
    """Identify the device, load configs, and route (or give vLLM its functions back)."""
    from vllm.triton_utils import dispatcher

    from spectune.identity import detect_device, detect_software

    identity = detect_device(device.index if device.type != "cpu" else None)
    configs = _load_configs(identity, detect_software())
    force = _env_flag(ENV_FORCE)
    head = f"spectune: device {identity.describe()}; database: {configs.description}"
    if configs.usable == 0 and not force:
        router.uninstall(dispatcher)
        logger.warning("%s; %d tuned configs usable here; nothing routed (%s=1 routes with "
                       "default configs)", head, configs.usable, ENV_FORCE)
        return
    router.configure(configs.lookup, identity.backend)
    routed = "vLLM V1 rejection sampling"
    if isinstance(getattr(router.module, "expand_kernel", None), dispatcher.KernelOverride):
        router.route_expand(dispatcher)
        routed += " and the CPU expand step"
    why = f" ({ENV_FORCE}=1)" if configs.usable == 0 else ""
    logger.info("%s; %d tuned configs usable here%s; routed %s to spectune kernels "
                "(RNG: %s)", head, configs.usable, why, routed, router.rng)


# --------------------------------------------------------------------------------------
# Database seam
# --------------------------------------------------------------------------------------


class _Configs:
    """Tuned configs usable on this device.

    Attributes:
        lookup: Problem -> config (``None``: no tuned row; the default is used).
        description: Which databases, for the log line.
        usable: How many configs are usable here.
    """

    __slots__ = ("description", "lookup", "usable")

    def __init__(
        self, lookup: Callable[[Problem], dict[str, int] | None], description: str, usable: int
    ) -> None:
        self.lookup = lookup
        self.description = description
        self.usable = usable


def _no_config(problem: Problem) -> dict[str, int] | None:
    return None


def _load_configs(device: DeviceIdentity, software: SoftwareIdentity) -> _Configs:
    """Load the tuned configs usable on ``device`` (lookup order of :mod:`spectune.db`)."""
    try:
        from spectune.db import load_index
    except ImportError:
        return _Configs(_no_config, "no database yet (spectune.db has no reader)", 0)
    from spectune.kernels import get_family

    family = get_family(_KERNEL)
    index = load_index(
        device=device,
        software=software,
        kernel_hashes={family.name: family.source_hash},
        spaces={family.name: family.search_space(device.backend)},
    )
    sources = getattr(index, "sources", ())
    description = "; ".join(s.describe() for s in sources) or "no databases"

    def lookup(problem: Problem) -> dict[str, int] | None:
        return index.lookup(device=device, software=software, kernel=family.name,
                            problem=problem)

    return _Configs(lookup, description, len(index))


# --------------------------------------------------------------------------------------
# spectune doctor (spectune/_vllm_doctor.py)
# --------------------------------------------------------------------------------------


def diagnose() -> Diagnosis:
    """What a vLLM worker started like this process would decide, and why (no vLLM run)."""
    from spectune._vllm_doctor import diagnose as _diagnose

    return _diagnose()


def self_test() -> SelfTest:
    """A few verification calls through the routing beside vLLM's own function.

    Counted by :func:`routed_calls`. Needs Triton able to run (a GPU or
    ``TRITON_INTERPRET=1``).
    """
    from spectune._vllm_doctor import self_test as _self_test

    return _self_test()


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def _vllm_version() -> str:
    from vllm.version import __version__

    return str(__version__)


def _supported_text() -> str:
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED_VLLM
    return f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor}"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
