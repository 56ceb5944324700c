"""The hot path of the vLLM plugin: vLLM's V1 ``rejection_sample``, routed to spectune.

:class:`Router` replaces the module-level function ``rejection_sample`` of
``vllm.v1.sample.rejection_sampler`` (the one ``RejectionSampler.forward`` calls) with
one that draws the random inputs as vLLM does (or, with ``SPECTUNE_RNG=fused``, lets
the kernels draw them) and launches :func:`spectune.kernels.rejection_sample` with the
launch config looked up once per shape. Calls it does not support (synthetic
acceptance, non-float32 draft probabilities, vocabularies past the kernels' limit) go
to vLLM's original function.

:func:`expand_kernel` is a correct replacement for the C++ fallback that vLLM's CPU
platform registers for ``expand_kernel`` (per-request values to per-token values: the
temperatures, top-k and top-p of every draft row); see :meth:`Router.route_expand`.

Only :mod:`spectune.vllm_plugin` imports this module, and only in a vLLM worker.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from spectune.space import Problem

__all__ = [
    "EXPAND_KERNEL",
    "RNG_FUSED",
    "RNG_MODES",
    "RNG_VLLM",
    "Router",
    "RouterStats",
    "expand_kernel",
    "vllm_random_inputs",
]

#: Random inputs drawn exactly as vLLM draws them (seeded requests match vLLM).
RNG_VLLM = "vllm"
#: Random inputs drawn inside the kernels from one seed per request.
RNG_FUSED = "fused"
RNG_MODES = (RNG_VLLM, RNG_FUSED)

#: vLLM's name of the per-request -> per-token expand kernel (dispatcher registry key).
EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"

_SEED_HIGH = 2**63 - 1

#: A shape key: (k, batch, vocab, logits dtype, draft probabilities given).
ShapeKey = tuple[int, int, int, torch.dtype, bool]
#: Problem -> tuned config, or None (then the kernels' default config is used).
Lookup = Callable[["Problem"], "dict[str, int] | None"]


class RouterStats:
    """What the router did in this process.

    Plain classes here, not dataclasses: this module is imported on vLLM's worker
    start-up path, where generating dataclass methods costs milliseconds.

    Attributes:
        routed: Verification calls that ran spectune's kernels.
        passed: Calls handed to vLLM's original function (unsupported there).
        tuned_shapes: Shapes seen that had a tuned config.
        default_shapes: Shapes seen that used the kernels' default config.
    """

    __slots__ = ("default_shapes", "passed", "routed", "tuned_shapes")

    def __init__(self) -> None:
        self.routed = 0
        self.passed = 0
        self.tuned_shapes = 0
        self.default_shapes = 0

    def __repr__(self) -> str:
        return (f"RouterStats(routed={self.routed}, passed={self.passed}, "
                f"tuned_shapes={self.tuned_shapes}, default_shapes={self.default_shapes})")


class Router:
    """Routes vLLM's V1 verification to spectune's kernels.

    Attributes:
        module: ``vllm.v1.sample.rejection_sampler``.
        lookup: Tuned-config lookup, set by :meth:`configure` (at the first call on
            GPUs, where the device is identified then).
        backend: Backend name of the search space (``cuda``, ``hip``,
            ``cpu-interpreter``), for default configs.
        rng: :data:`RNG_VLLM` or :data:`RNG_FUSED`.
        on_first_call: Called with the device of the first call when the router is
            not configured yet; it calls :meth:`configure` (route) or
            :meth:`uninstall` (vLLM's function from then on).
        on_error: Called with the exception when a routed call fails; the router is
            uninstalled first and the call goes to vLLM's original function.
    """

    def __init__(
        self,
        module: ModuleType,
        *,
        rng: str = RNG_VLLM,
        on_first_call: Callable[[Router, torch.device], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.module = module
        self.lookup: Lookup | None = None
        self.backend = "cuda"
        self.rng = rng
        self.on_first_call = on_first_call
        self.on_error = on_error
        self.stats = RouterStats()
        self._configured = False
        self._kernels: ModuleType | None = None
        self._original: Callable[..., torch.Tensor] | None = None
        self._original_expand: Callable[..., Any] | None = None
        self._expand_override: Any = None
        self._configs: dict[ShapeKey, dict[str, int]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = "configured" if self._configured else "not configured"
        return f"Router({state}, installed={self.installed}, rng={self.rng!r}, {self.stats})"

    # ------------------------------------------------------------------ install

    @property
    def installed(self) -> bool:
        """Whether vLLM's ``rejection_sample`` is currently this router's."""
        return getattr(self.module.rejection_sample, "__self__", None) is self

    @property
    def original(self) -> Callable[..., torch.Tensor]:
        """vLLM's own ``rejection_sample``."""
        if self._original is not None:
            return self._original
        return _unwrap(self.module.rejection_sample)

    def install(self) -> None:
        """Put :meth:`rejection_sample` in place of vLLM's function (idempotent)."""
        current = self.module.rejection_sample
        if getattr(current, "__self__", None) is self:
            return
        self._original = _unwrap(current)
        self.module.rejection_sample = self.rejection_sample

    @property
    def configured(self) -> bool:
        """Whether :meth:`configure` has set the config lookup."""
        return self._configured

    def configure(self, lookup: Lookup, backend: str) -> None:
        """Set the config lookup (and forget cached per-shape configs).

        Imports the kernels here, not at module import: on GPUs the worker hook installs
        the router at once and imports the kernels in the background until the first
        call configures it.
        """
        from spectune.kernels import rejection

        self._kernels = rejection
        self.lookup = lookup
        self.backend = backend
        self._configs.clear()
        self._configured = True

    def reset(self) -> None:
        """Forget the configuration (a new engine in this process decides again)."""
        self.lookup = None
        self.on_first_call = None
        self._configs.clear()
        self._configured = False

    def route_expand(self, dispatcher: ModuleType) -> None:
        """Make vLLM's ``expand_kernel`` override launch :func:`expand_kernel`.

        Only for platforms whose ``expand_kernel`` is already a fallback override (the
        CPU platform): a GPU's Triton ``expand_kernel`` is correct, and vLLM's JIT
        warmup rejects launchers that are not Triton kernels.

        The platform's override object is already what every holder of the kernel
        points at (vLLM rebound them all when it registered it), so it is retargeted in
        place: ``register_kernels`` would scan every loaded module again to rebind
        them, about 90 ms of worker startup. When the override does not look like
        vLLM 0.32's, ``register_kernels`` is used after all.
        """
        current = getattr(self.module, "expand_kernel", None)
        impl = getattr(current, "func", None)
        if impl is expand_kernel:
            return
        self._original_expand = impl
        if _retarget(current, expand_kernel):
            self._expand_override = current
            _set_registry(dispatcher, expand_kernel)
        else:
            with _quiet(dispatcher.logger):
                dispatcher.register_kernels({EXPAND_KERNEL: expand_kernel})

    def uninstall(self, dispatcher: ModuleType | None = None) -> None:
        """Give vLLM back its own functions (idempotent)."""
        if getattr(self.module.rejection_sample, "__self__", None) is self:
            self.module.rejection_sample = self.original
        original, override = self._original_expand, self._expand_override
        current = getattr(self.module, "expand_kernel", None)
        if original is not None and getattr(current, "func", None) is expand_kernel:
            if current is override and _retarget(current, original):
                if dispatcher is not None:
                    _set_registry(dispatcher, original)
            elif dispatcher is not None:
                with _quiet(dispatcher.logger):
                    dispatcher.register_kernels({EXPAND_KERNEL: original})
        self._original_expand = None
        self._expand_override = None

    # ------------------------------------------------------------------ hot path

    def config_for(
        self, k: int, batch: int, vocab: int, dtype: torch.dtype, has_draft_probs: bool
    ) -> dict[str, int]:
        """Launch config for a shape: tuned when the database has one, else default."""
        key = (k, batch, vocab, dtype, has_draft_probs)
        config = self._configs.get(key)
        if config is not None:
            return config
        from spectune.space import Problem

        problem = Problem(
            spec_len=max(k, 1), batch=max(batch, 1), vocab=vocab,
            dtype=str(dtype).removeprefix("torch."), draft_probs=has_draft_probs,
        )
        tuned = self.lookup(problem) if self.lookup is not None else None
        if tuned is not None:
            self.stats.tuned_shapes += 1
            config = dict(tuned)
        else:
            self.stats.default_shapes += 1
            assert self._kernels is not None
            config = self._kernels.default_config(problem, self.backend)
        self._configs[key] = config
        return config

    def rejection_sample(
        self,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: list[int],
        max_spec_len: int,
        cu_num_draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_logits: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        sampling_metadata: Any,
        synthetic_mode: bool = False,
        synthetic_conditional_rates: torch.Tensor | None = None,
        use_fp64_gumbel: bool = False,
    ) -> torch.Tensor:
        """Drop-in for vLLM 0.32's ``rejection_sample`` (same arguments, same output)."""
        args = (
            draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
            draft_probs, target_logits, bonus_token_ids, sampling_metadata,
        )
        kwargs = {
            "synthetic_mode": synthetic_mode,
            "synthetic_conditional_rates": synthetic_conditional_rates,
            "use_fp64_gumbel": use_fp64_gumbel,
        }
        original = self.original
        if not self._configured:
            self._first_call(target_logits.device)
            if not self._configured or not self.installed:
                return original(*args, **kwargs)
        kernels = self._kernels
        assert kernels is not None
        if synthetic_mode or not _supported(draft_probs, target_logits, kernels.MAX_VOCAB):
            self.stats.passed += 1
            return original(*args, **kwargs)
        try:
            launch_args, launch_kwargs = self.prepare(*args, use_fp64_gumbel=use_fp64_gumbel)
            out = kernels.rejection_sample(*launch_args, **launch_kwargs)
        except Exception as exc:
            self.uninstall()
            if self.on_error is not None:
                self.on_error(exc)
            return original(*args, **kwargs)
        self.stats.routed += 1
        return out

    def _first_call(self, device: torch.device) -> None:
        with self._lock:
            if self._configured:
                return
            try:
                if self.on_first_call is None:
                    raise RuntimeError("router called before it was configured")
                self.on_first_call(self, device)
            except Exception as exc:
                self.uninstall()
                if self.on_error is not None:
                    self.on_error(exc)

    def prepare(
        self,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: list[int],
        max_spec_len: int,
        cu_num_draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        target_logits: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        sampling_metadata: Any,
        *,
        use_fp64_gumbel: bool = False,
    ) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
        """Arguments of the kernel launch for one call (random inputs drawn here)."""
        batch = len(num_draft_tokens)
        vocab = target_logits.shape[-1]
        if not target_logits.is_contiguous():
            target_logits = target_logits.contiguous()
        config = self.config_for(
            max_spec_len, batch, vocab, target_logits.dtype, draft_probs is not None
        )
        kwargs: dict[str, Any] = {
            "max_spec_len": max_spec_len,
            "draft_probs": draft_probs,
            "config": config,
            "validate": False,
        }
        if not sampling_metadata.all_greedy:
            kwargs["is_greedy"] = sampling_metadata.temperature == 0
            device = target_logits.device
            if self.rng == RNG_FUSED:
                kwargs["seeds"] = fused_seeds(
                    num_draft_tokens, sampling_metadata.generators, device
                )
            else:
                kwargs["uniform_probs"], kwargs["inv_q"] = vllm_random_inputs(
                    self.module, draft_token_ids.shape[0], num_draft_tokens,
                    sampling_metadata.generators, vocab, device,
                    use_fp64_gumbel=use_fp64_gumbel,
                )
        return (draft_token_ids, cu_num_draft_tokens, target_logits, bonus_token_ids), kwargs


def vllm_random_inputs(
    module: ModuleType,
    num_tokens: int,
    num_draft_tokens: list[int],
    generators: Mapping[int, torch.Generator],
    vocab: int,
    device: torch.device,
    *,
    use_fp64_gumbel: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The coins and reciprocal exponentials vLLM 0.32 draws, in vLLM's order.

    The coins come from vLLM's own ``generate_uniform_probs``; the exponentials repeat
    ``sample_recovered_tokens``' draw (vLLM has no function for that step alone): one
    ``[B, V]`` draw from the default generator, then each seeded request with drafts
    redrawn from its own generator.
    """
    uniform = module.generate_uniform_probs(num_tokens, num_draft_tokens, generators, device)
    q_dtype = torch.float64 if use_fp64_gumbel else torch.float32
    q = torch.empty((len(num_draft_tokens), vocab), dtype=q_dtype, device=device)
    q.exponential_()
    for i, generator in generators.items():
        if num_draft_tokens[i] > 0:
            q[i].exponential_(generator=generator)
    return uniform, q.reciprocal()


def fused_seeds(
    num_draft_tokens: list[int],
    generators: Mapping[int, torch.Generator],
    device: torch.device,
) -> torch.Tensor:
    """One Philox seed per request: from its generator when seeded, else the default."""
    seeds = torch.randint(0, _SEED_HIGH, (len(num_draft_tokens),), dtype=torch.int64,
                          device=device)
    for i, generator in generators.items():
        if num_draft_tokens[i] > 0:
            seeds[i] = torch.randint(0, _SEED_HIGH, (1,), dtype=torch.int64,
                                     device=generator.device, generator=generator)[0]
    return seeds


def expand_kernel(
    output_ptr: torch.Tensor,
    input_ptr: torch.Tensor,
    cu_num_tokens_ptr: torch.Tensor,
    replace_from: float,
    replace_to: float,
    MAX_NUM_TOKENS: int | None = None,  # vLLM's kernel argument name
) -> None:
    """vLLM's ``expand_kernel``: ``output[t] = input[request of t]``, any dtype.

    Parameter names are the Triton kernel's, so vLLM's ``KernelOverride`` forwards the
    launch arguments by name. Values equal to ``replace_from`` become ``replace_to``
    (greedy temperature 0 -> 1). Written into ``output`` in place, float or integer.
    """
    values = input_ptr
    if replace_from != replace_to:
        values = values.masked_fill(values == replace_from, replace_to)
    cu = cu_num_tokens_ptr.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1)).clamp_(min=0)
    if MAX_NUM_TOKENS is not None:
        counts.clamp_(max=MAX_NUM_TOKENS)
    expanded = torch.repeat_interleave(values, counts)
    n = min(expanded.shape[0], output_ptr.shape[0])
    output_ptr[:n].copy_(expanded[:n])


def _supported(
    draft_probs: torch.Tensor | None, target_logits: torch.Tensor, max_vocab: int
) -> bool:
    if target_logits.shape[-1] > max_vocab or target_logits.dtype not in _LOGITS_DTYPES:
        return False
    return draft_probs is None or draft_probs.dtype == torch.float32


_LOGITS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _unwrap(function: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's function behind a (possibly stale) router's bound method."""
    owner = getattr(function, "__self__", None)
    if isinstance(owner, Router):
        return owner.original
    return function


def _retarget(override: Any, impl: Callable[..., Any]) -> bool:
    """Point vLLM's ``KernelOverride`` ``override`` at ``impl``; ``False`` if unknown shape.

    vLLM 0.32's ``KernelOverride`` launches ``_impl``, exposes it as ``func``, and
    forwards launch keywords by name when ``impl``'s parameters are the kernel's.
    """
    names = getattr(override, "arg_names", None)
    if not all(hasattr(override, a) for a in ("_impl", "func", "_forward_by_name")) or (
        not isinstance(names, tuple)
    ):
        return False
    override._impl = impl
    override.func = impl
    override._forward_by_name = tuple(inspect.signature(impl).parameters) == names
    return True


def _set_registry(dispatcher: ModuleType, impl: Callable[..., Any]) -> None:
    """Keep vLLM's override registry saying which implementation is in place."""
    registry = getattr(dispatcher, "_registry", None)
    if isinstance(registry, dict) and EXPAND_KERNEL in registry:
        registry[EXPAND_KERNEL] = (registry[EXPAND_KERNEL][0], impl)


@contextlib.contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    """Silence the dispatcher's 'already registered, overwriting' warning: we mean it."""
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
