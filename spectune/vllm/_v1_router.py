"""vLLM's V1 verification, routed to spectune's rejection-sampling kernel family.

:class:`Router` replaces the module-level function ``rejection_sample`` of
``vllm.v1.sample.rejection_sampler`` (the one ``RejectionSampler.forward`` calls) with
one that draws the random inputs as vLLM does (or, with ``SPECTUNE_RNG=fused``, lets
the kernels draw them) and launches its kernel family with the launch config looked up
once per shape. Calls it does not support (synthetic acceptance, non-float32 draft
probabilities, vocabularies past the kernels' limit) go to vLLM's original function.

A router is built once per engine with its kernel family's name; :meth:`Router.activate`
identifies the device and loads the tuned configs (:class:`spectune.vllm._configs.
TunedConfigs`), then routes or hands vLLM its function back, and logs one line. The
worker hook activates it at once on CPU; on GPUs it activates itself at its first call,
when vLLM has selected the worker's device. Whatever fails is logged once and vLLM's
own function is used from then on.

:func:`expand_kernel` is a correct replacement for the C++ fallback that vLLM's CPU
platform registers for ``expand_kernel`` (per-request values to per-token values: the
temperatures, top-k and top-p of every draft row); see :meth:`Router.route_expand`.
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

from spectune.messages import one_line
from spectune.vllm._settings import ENV_FORCE, RNG_FUSED, RNG_VLLM, forced, logger

if TYPE_CHECKING:
    from spectune.kernels import KernelFamily, RejectionInputs
    from spectune.vllm._configs import TunedConfigs

__all__ = [
    "EXPAND_KERNEL",
    "V1_KERNEL",
    "Router",
    "RouterStats",
    "expand_kernel",
    "fused_seeds",
    "vllm_random_inputs",
]

#: The kernel family that verifies V1's drafts.
V1_KERNEL = "rejection_sample"
#: vLLM's name of the per-request -> per-token expand kernel (dispatcher registry key).
EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"

_SEED_HIGH = 2**63 - 1

#: A shape key: (k, batch, vocab, logits dtype, draft probabilities given).
ShapeKey = tuple[int, int, int, torch.dtype, bool]


class RouterStats:
    """What a router did.

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
    """Routes vLLM's V1 verification to one spectune kernel family.

    Args:
        module: ``vllm.v1.sample.rejection_sampler``.
        kernel: Name of the kernel family that runs the verification.
        rng: ``vllm`` (random inputs drawn as vLLM draws them) or ``fused`` (drawn by
            the kernels from one seed per request).

    Attributes:
        configs: The tuned configs in use, once :meth:`configure` (or
            :meth:`activate`) has set them.
        stats: What the router did.
    """

    def __init__(self, module: ModuleType, *, kernel: str = V1_KERNEL, rng: str = RNG_VLLM) -> None:
        self.module = module
        self.kernel = kernel
        self.rng = rng
        self.configs: TunedConfigs | None = None
        self.stats = RouterStats()
        self._family: KernelFamily | None = None
        self._max_vocab = 0
        self._logits_dtypes: tuple[torch.dtype, ...] = ()
        self._inputs_type: type[RejectionInputs] | None = None
        self._original: Callable[..., torch.Tensor] | None = None
        self._original_expand: Callable[..., Any] | None = None
        self._expand_override: Any = None
        self._shape_configs: dict[ShapeKey, dict[str, int]] = {}
        self._failed = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = "configured" if self.configured else "not configured"
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
        """Whether :meth:`configure` has set the tuned configs and the kernel family."""
        return self._family is not None

    def configure(self, configs: TunedConfigs) -> None:
        """Use ``configs`` (and forget cached per-shape configs); imports the kernels.

        The kernels are imported here, not at module import: on GPUs the worker hook
        installs the router at once and imports the kernels in the background until the
        first call activates it.
        """
        from spectune.kernels import LOGITS_DTYPES, MAX_VOCAB, RejectionInputs, get_family

        self._family = get_family(self.kernel)
        self._inputs_type = RejectionInputs
        self._max_vocab = MAX_VOCAB
        self._logits_dtypes = tuple(LOGITS_DTYPES)
        self.configs = configs
        self._shape_configs.clear()

    def activate(self, device: torch.device) -> bool:
        """Identify ``device``, load its tuned configs, and route or step aside.

        With no tuned config usable on the device (and no ``SPECTUNE_FORCE=1``), vLLM's
        functions are given back: the point of routing is the tuned configs. Logs one
        line either way.

        Returns:
            Whether the router routes from now on.

        Raises:
            Exception: whatever identifying the device or importing the kernels raised;
                the caller uninstalls and reports it.
        """
        from vllm.triton_utils import dispatcher

        from spectune.vllm._configs import TunedConfigs

        configs = TunedConfigs.load(device)
        if configs.usable == 0 and not forced():
            self.uninstall()
            logger.warning("%s; %d tuned configs usable here; nothing routed (%s=1 routes "
                           "with default configs)", configs.describe(), configs.usable,
                           ENV_FORCE)
            return False
        self.configure(configs)
        routed = "vLLM V1 rejection sampling"
        # Only a platform fallback (the CPU platform's C++ expand) is replaced: a GPU's
        # Triton expand_kernel is correct.
        if isinstance(getattr(self.module, "expand_kernel", None), dispatcher.KernelOverride):
            self.route_expand()
            routed += " and the CPU expand step"
        why = f" ({ENV_FORCE}=1)" if configs.usable == 0 else ""
        logger.info("%s; %d tuned configs usable here%s; routed %s to spectune kernels "
                    "(RNG: %s)", configs.describe(), configs.usable, why, routed, self.rng)
        return True

    def route_expand(self) -> None:
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
        from vllm.triton_utils import dispatcher

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

    def uninstall(self) -> None:
        """Give vLLM back its own functions (idempotent)."""
        if getattr(self.module.rejection_sample, "__self__", None) is self:
            self.module.rejection_sample = self.original
        original, override = self._original_expand, self._expand_override
        current = getattr(self.module, "expand_kernel", None)
        if original is not None and getattr(current, "func", None) is expand_kernel:
            from vllm.triton_utils import dispatcher

            if current is override and _retarget(current, original):
                _set_registry(dispatcher, original)
            else:
                with _quiet(dispatcher.logger):
                    dispatcher.register_kernels({EXPAND_KERNEL: original})
        self._original_expand = None
        self._expand_override = None

    # ------------------------------------------------------------------ hot path

    def config_for(self, inputs: RejectionInputs) -> dict[str, int]:
        """Launch config for the shape of ``inputs``: tuned when the database has one, else
        the family's default. Looked up once per shape, then cached."""
        key = _shape_key(inputs.max_spec_len, inputs.cu_num_draft_tokens, inputs.target_logits,
                         inputs.draft_probs)
        config = self._shape_configs.get(key)
        return self._look_up(key, inputs) if config is None else config

    def _look_up(self, key: ShapeKey, inputs: RejectionInputs) -> dict[str, int]:
        """The first call of a shape: ask the tuned configs, else take the default."""
        family, configs = self._family, self.configs
        assert family is not None and configs is not None
        problem = family.problem_of(inputs)
        tuned = configs.lookup(family.name, problem)
        if tuned is not None:
            self.stats.tuned_shapes += 1
            config = dict(tuned)
        else:
            self.stats.default_shapes += 1
            config = family.default_config(problem, configs.backend)
        self._shape_configs[key] = config
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
        if not self.configured:
            self._first_call(target_logits.device)
            if not self.configured or not self.installed:
                return original(*args, **kwargs)
        family = self._family
        assert family is not None
        if synthetic_mode or not self._supported(draft_probs, target_logits):
            self.stats.passed += 1
            return original(*args, **kwargs)
        try:
            inputs, config = self.prepare(*args, use_fp64_gumbel=use_fp64_gumbel)
            out = family.launch(inputs, config)
        except Exception as exc:
            self._fail("a routed verification call failed", exc)
            return original(*args, **kwargs)
        self.stats.routed += 1
        return out

    def _first_call(self, device: torch.device) -> None:
        with self._lock:
            if self.configured or self._failed:
                return
            try:
                self.activate(device)
            except Exception as exc:
                self._fail("routing not set up at the first verification call", exc)

    def _fail(self, what: str, exc: BaseException) -> None:
        """Give vLLM its functions back for good, and say why once."""
        self._failed = True
        try:
            self.uninstall()
        except Exception:
            logger.debug("spectune: uninstall failed", exc_info=True)
        logger.warning("spectune: %s (%s: %s); vLLM's own kernels are used from now on",
                       what, type(exc).__name__, one_line(exc))

    def _supported(self, draft_probs: torch.Tensor | None, target_logits: torch.Tensor) -> bool:
        if target_logits.shape[-1] > self._max_vocab:
            return False
        if target_logits.dtype not in self._logits_dtypes:
            return False
        return draft_probs is None or draft_probs.dtype == torch.float32

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
    ) -> tuple[RejectionInputs, dict[str, int]]:
        """The kernel family's inputs for one call, and its launch config.

        The config is looked up before any random number is drawn: should the lookup
        fail, vLLM's function gets the call with every generator untouched.
        """
        if not target_logits.is_contiguous():
            target_logits = target_logits.contiguous()
        make_inputs = self._inputs_type
        key = _shape_key(max_spec_len, cu_num_draft_tokens, target_logits, draft_probs)
        config = self._shape_configs.get(key)
        if config is None:
            config = self._look_up(key, make_inputs(
                draft_token_ids=draft_token_ids, cu_num_draft_tokens=cu_num_draft_tokens,
                target_logits=target_logits, bonus_token_ids=bonus_token_ids,
                max_spec_len=max_spec_len, draft_probs=draft_probs,
            ))
        is_greedy = uniform_probs = inv_q = seeds = None
        if not sampling_metadata.all_greedy:
            is_greedy = sampling_metadata.temperature == 0
            device = target_logits.device
            if self.rng == RNG_FUSED:
                seeds = fused_seeds(num_draft_tokens, sampling_metadata.generators, device)
            else:
                uniform_probs, inv_q = vllm_random_inputs(
                    self.module, draft_token_ids.shape[0], num_draft_tokens,
                    sampling_metadata.generators, target_logits.shape[-1], device,
                    use_fp64_gumbel=use_fp64_gumbel,
                )
        inputs = make_inputs(
            draft_token_ids=draft_token_ids,
            cu_num_draft_tokens=cu_num_draft_tokens,
            target_logits=target_logits,
            bonus_token_ids=bonus_token_ids,
            max_spec_len=max_spec_len,
            draft_probs=draft_probs,
            is_greedy=is_greedy,
            uniform_probs=uniform_probs,
            inv_q=inv_q,
            seeds=seeds,
        )
        return inputs, config


def _shape_key(
    max_spec_len: int, cu_num_draft_tokens: torch.Tensor, target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
) -> ShapeKey:
    """What a launch config depends on: (k, batch, vocab, logits dtype, draft probs given)."""
    return (max_spec_len, cu_num_draft_tokens.shape[0], target_logits.shape[-1],
            target_logits.dtype, draft_probs is not None)


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
