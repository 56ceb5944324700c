"""vLLM's V1 verification, routed to spectune's rejection-sampling kernel family.

:class:`Router` replaces the module-level function ``rejection_sample`` of
``vllm.v1.sample.rejection_sampler`` (the one ``RejectionSampler.forward`` calls) with
one that draws the random inputs as vLLM does (or, with ``SPECTUNE_RNG=fused``, lets
the kernels draw them) and launches its kernel family with the launch config looked up
once per shape. Calls it does not implement (synthetic acceptance, non-float32 draft
probabilities, other logits dtypes, vocabularies past the kernels' limit) go to vLLM's
original function, counted with the reason. Installing, activating and failing safely
are :class:`spectune.vllm._router.SeamRouter`'s.

:func:`expand_kernel` is a correct replacement for the C++ fallback that vLLM's CPU
platform registers for ``expand_kernel`` (per-request values to per-token values: the
temperatures, top-k and top-p of every draft row); see :meth:`Router.route_expand`.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from spectune.vllm._router import SeamRouter
from spectune.vllm._settings import RNG_FUSED, RNG_VLLM

if TYPE_CHECKING:
    from spectune.kernels import KernelFamily
    from spectune.kernels.rejection import RejectionInputs
    from spectune.vllm._fold_routers import V1FoldRouter

__all__ = [
    "EXPAND_KERNEL",
    "V1_KERNEL",
    "Router",
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


class Router(SeamRouter):
    """Routes vLLM's V1 verification to one spectune kernel family.

    Args:
        module: ``vllm.v1.sample.rejection_sampler``.
        kernel: Name of the kernel family that runs the verification.
        rng: ``vllm`` (random inputs drawn as vLLM draws them) or ``fused`` (drawn by
            the kernels from one seed per request).
    """

    runner = "vLLM V1 rejection sampling"

    def __init__(self, module: ModuleType, *, kernel: str = V1_KERNEL, rng: str = RNG_VLLM) -> None:
        super().__init__(module, kernel=kernel)
        self.rng = rng
        self._max_vocab = 0
        self._logits_dtypes: tuple[torch.dtype, ...] = ()
        self._inputs_type: type[RejectionInputs] | None = None
        self._original_expand: Callable[..., Any] | None = None
        self._expand_override: Any = None
        #: The companion that defers ``apply_sampling_constraints`` into this router's
        #: calls (folded verification), if any.
        self.fold: V1FoldRouter | None = None

    def __repr__(self) -> str:
        state = "configured" if self.configured else "not configured"
        return f"Router({state}, installed={self.installed}, rng={self.rng!r}, {self.stats})"

    def _configure_kernels(self) -> None:
        from spectune.kernels import LOGITS_DTYPES, MAX_VOCAB
        from spectune.kernels.rejection import RejectionInputs

        self._inputs_type = RejectionInputs
        self._max_vocab = MAX_VOCAB
        self._logits_dtypes = tuple(LOGITS_DTYPES)

    def _route_extras(self) -> str:
        from vllm.triton_utils import dispatcher

        # Only a platform fallback (the CPU platform's C++ expand) is replaced: a GPU's
        # Triton expand_kernel is correct.
        if isinstance(getattr(self.module, "expand_kernel", None), dispatcher.KernelOverride):
            self.route_expand()
            return " and the CPU expand step"
        return ""

    def _details(self) -> str:
        return f"RNG: {self.rng}"

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
        super().uninstall()
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
        family = self._family
        assert family is not None
        return self.config_of(key, lambda: family.problem_of(inputs))

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
        fly_window_size: int | None = None,
        fly_entropy_threshold: float | None = None,
        fly_entropy_top_k: int = 3,
    ) -> torch.Tensor:
        """Drop-in for vLLM's ``rejection_sample``, 0.32's and 0.33's (same arguments,
        same output; a FLy window, which only 0.33 passes, verifies with 0.33's FLy).

        When the fold companion deferred the sampling parameters of ``target_logits``,
        they are folded into the verification; a call that is not routed gets them
        applied by vLLM's step first, as vLLM would have.
        """
        args = (
            draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
            draft_probs, target_logits, bonus_token_ids, sampling_metadata,
        )
        kwargs: dict[str, Any] = {
            "synthetic_mode": synthetic_mode,
            "synthetic_conditional_rates": synthetic_conditional_rates,
            "use_fp64_gumbel": use_fp64_gumbel,
        }
        fly = None
        if fly_window_size is not None:
            # Only vLLM 0.33 passes a window, and its function takes these.
            fly = {"fly_window_size": fly_window_size,
                   "fly_entropy_threshold": fly_entropy_threshold,
                   "fly_entropy_top_k": fly_entropy_top_k}
            kwargs.update(fly)
        fold = self.fold
        pending = fold.take(target_logits) if fold is not None else None
        fallback = None
        if pending is not None:
            assert fold is not None
            original = self.original

            def fallback() -> torch.Tensor:
                processed = fold.materialize(pending)
                return original(*args[:5], processed, *args[6:], **kwargs)  # type: ignore[no-any-return]

        return self._route(  # type: ignore[no-any-return]
            target_logits.device, args, kwargs,
            lambda: "synthetic acceptance" if synthetic_mode else self._unsupported(
                draft_probs, target_logits
            ),
            lambda: self.prepare(*args, use_fp64_gumbel=use_fp64_gumbel,
                                 folded=pending is not None, fly=fly),
            fallback=fallback,
        )

    def _unsupported(
        self, draft_probs: torch.Tensor | None, target_logits: torch.Tensor
    ) -> str:
        """Why a call is not routed (empty when it is)."""
        if target_logits.shape[-1] > self._max_vocab:
            return "vocabulary over the kernels' limit"
        if target_logits.dtype not in self._logits_dtypes:
            return f"{target_logits.dtype} target logits"
        if draft_probs is not None and draft_probs.dtype != torch.float32:
            return f"{draft_probs.dtype} draft probabilities"
        return ""

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
        folded: bool = False,
        fly: dict[str, Any] | None = None,
    ) -> tuple[RejectionInputs, dict[str, int]]:
        """The kernel family's inputs for one call, and its launch config.

        The config is looked up before any random number is drawn: should the lookup
        fail, vLLM's function gets the call with every generator untouched. ``folded``:
        the logits are raw, and the sampling parameters go to the folded family.
        ``fly``: vLLM 0.33's FLy arguments (a window), verified with its FLy (the same
        config: FLy runs the family's kernels, then its own two small launches).
        """
        if not target_logits.is_contiguous():
            target_logits = target_logits.contiguous()
        if not self._live:  # activated, not yet called: take what this needs
            self._take_kernels()
        make_inputs = self._inputs_type
        family = self._family
        assert make_inputs is not None and family is not None
        key = _shape_key(max_spec_len, cu_num_draft_tokens, target_logits, draft_probs)
        fold_family = self.fold.family if folded and self.fold is not None else None
        config = self.config_of(key, lambda: family.problem_of(make_inputs(
            draft_token_ids=draft_token_ids, cu_num_draft_tokens=cu_num_draft_tokens,
            target_logits=target_logits, bonus_token_ids=bonus_token_ids,
            max_spec_len=max_spec_len, draft_probs=draft_probs,
        )), family=fold_family)
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
            **(fly or {}),
        )
        if fold_family is not None:
            inputs.temperature = sampling_metadata.temperature
            inputs.top_k = sampling_metadata.top_k
            inputs.top_p = sampling_metadata.top_p
        return inputs, config

    def _launch(self, family: KernelFamily, inputs: Any, config: dict[str, int]) -> Any:
        fold = self.fold
        if fold is not None and fold.family is not None and inputs.sampling_kwargs():
            out = fold.family.launch(inputs, config)
            fold.stats.routed += 1
            return out
        return family.launch(inputs, config)


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
