"""vLLM's sampling steps, routed to spectune's sampling kernel families.

The steps that make the target distribution a verification tests drafts against (and
that sample every token): top-k/top-p masking, and Model Runner V2's temperature, min-p
and Gumbel sampling. Each router here replaces one module-level name of vLLM, the one a
caller looks up at call time:

============================================================  ==============  =========
vLLM name                                                     runner          family
============================================================  ==============  =========
``vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p``    V1 sampler      top_k_top_p
``vllm.v1.sample.rejection_sampler.apply_top_k_top_p``        V1 verification top_k_top_p
``vllm.v1.worker.gpu.sample.states.apply_top_k_top_p``        MRV2            top_k_top_p
``vllm.v1.worker.gpu.sample.sampler.apply_top_k_top_p``       MRV2            top_k_top_p
``vllm.v1.worker.gpu.sample.states.apply_temperature``        MRV2            temperature
``vllm.v1.worker.gpu.sample.states.apply_min_p``              MRV2            min_p
``vllm.v1.worker.gpu.sample.sampler.gumbel_sample``           MRV2            gumbel_sample
``vllm.v1.worker.gpu.spec_decode.speculator.gumbel_sample``   MRV2 drafter    gumbel_sample
============================================================  ==============  =========

They are companions of the engine's verification router
(:meth:`spectune.vllm._router.SeamRouter.add_companion`): installed, configured and
given back with it, so one database read and one log line cover them all. Each call
runs spectune's launcher in place, as vLLM's function does, with the config tuned for
its shape (rows, vocabulary, dtype); a call a family does not take (a dtype, a layout)
goes to vLLM's function, counted with its reason. No routed call reads tensor contents.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from spectune.vllm._router import SeamRouter

if TYPE_CHECKING:
    import torch

    from spectune.kernels import KernelFamily
    from spectune.space import Problem

__all__ = [
    "MRV2_SAMPLING_SEAMS",
    "V1_SAMPLING_SEAMS",
    "GumbelRouter",
    "MinPRouter",
    "SamplingRouter",
    "TemperatureRouter",
    "TopKTopPRouter",
    "sampling_routers",
]

_TOPK_TOPP_SAMPLER = "vllm.v1.sample.ops.topk_topp_sampler"
_V1_REJECTION = "vllm.v1.sample.rejection_sampler"
_MRV2_STATES = "vllm.v1.worker.gpu.sample.states"
_MRV2_SAMPLER = "vllm.v1.worker.gpu.sample.sampler"
_MRV2_SPECULATOR = "vllm.v1.worker.gpu.spec_decode.speculator"


class SamplingRouter(SeamRouter):
    """A companion router for one sampling step: vLLM's function, in place, by
    spectune's launcher (what :meth:`_configure_kernels` of a subclass takes)."""

    def __init__(self, module: ModuleType, *, kernel: str) -> None:
        super().__init__(module, kernel=kernel)
        self._launcher: Callable[..., Any] | None = None
        self._problem_for: Callable[..., Problem] | None = None
        self._max_vocab = 0
        self._logits_dtypes: tuple[torch.dtype, ...] = ()

    def _configure_kernels(self) -> None:
        from spectune.kernels import LOGITS_DTYPES, MAX_VOCAB

        self._max_vocab = MAX_VOCAB
        self._logits_dtypes = tuple(LOGITS_DTYPES)

    def _launch(self, family: KernelFamily, inputs: Any, config: dict[str, int]) -> Any:
        args, kwargs = inputs
        launcher = self._launcher
        assert launcher is not None
        return launcher(*args, **kwargs, config=config, validate=False)

    def _call(self, logits: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any],
              why_not: Callable[[], str]) -> Any:
        """Route one call whose first argument is the ``[rows, V]`` logits."""
        return self._route(logits.device, args, kwargs, why_not,
                           lambda: ((args, kwargs), self._config(logits)))

    def _config(self, logits: torch.Tensor) -> dict[str, int]:
        rows, vocab = logits.shape
        key = (rows, vocab, logits.dtype)
        problem_for = self._problem_for
        assert problem_for is not None
        return self.config_of(key, lambda: problem_for(num_tokens=rows, vocab=vocab,
                                                       dtype=logits.dtype))

    def _logits_unsupported(self, logits: torch.Tensor) -> str:
        """Why a family cannot take these logits (empty when it can); shapes only."""
        if logits.dim() != 2:
            return "logits not 2-D"
        if logits.dtype not in self._logits_dtypes:
            return f"{logits.dtype} logits"
        if logits.shape[-1] > self._max_vocab:
            return "vocabulary over the kernels' limit"
        if logits.numel() and logits.stride(-1) != 1:
            return "logits not contiguous in the vocabulary"
        return ""


class TopKTopPRouter(SamplingRouter):
    """``apply_top_k_top_p(logits, k, p)`` of either runner, by the ``top_k_top_p`` family."""

    seam = "apply_top_k_top_p"
    runner = "top-k/top-p"

    def __init__(self, module: ModuleType, *, kernel: str = "top_k_top_p") -> None:
        super().__init__(module, kernel=kernel)

    def _configure_kernels(self) -> None:
        from spectune.kernels import top_k_top_p
        from spectune.kernels.sampling import rows_problem

        super()._configure_kernels()
        self._launcher, self._problem_for = top_k_top_p, rows_problem

    def apply_top_k_top_p(
        self, logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
        has_topp_only_rows: bool | None = None,
    ) -> torch.Tensor:
        """Drop-in for vLLM's ``apply_top_k_top_p``, 0.32's and 0.33's (masks in place,
        returns it). ``has_topp_only_rows`` (0.33's, passed on as given) does not change
        the mask."""
        args = (logits, k, p)
        kwargs = {} if has_topp_only_rows is None else {"has_topp_only_rows": has_topp_only_rows}
        return self._call(logits, args, kwargs, lambda: self._unsupported(logits, k, p))

    def _unsupported(self, logits: torch.Tensor, k: torch.Tensor | None,
                     p: torch.Tensor | None) -> str:
        import torch

        reason = self._logits_unsupported(logits)
        if reason:
            return reason
        rows = logits.shape[0]
        if k is not None and (k.dtype not in (torch.int32, torch.int64)
                              or tuple(k.shape) != (rows,) or not k.is_contiguous()):
            return "top-k tensor layout or dtype"
        if p is not None and (p.dtype != torch.float32 or tuple(p.shape) != (rows,)
                              or not p.is_contiguous()):
            return "top-p tensor layout or dtype"
        return ""


class _StateParamRouter(SamplingRouter):
    """MRV2's in-place steps ``f(logits, expanded_idx_mapping, values)``."""

    def _state_call(self, logits: torch.Tensor, expanded_idx_mapping: torch.Tensor,
                    values: torch.Tensor) -> None:
        args = (logits, expanded_idx_mapping, values)
        self._call(logits, args, {},
                   lambda: self._unsupported(logits, expanded_idx_mapping, values))

    def _unsupported(self, logits: torch.Tensor, expanded_idx_mapping: torch.Tensor,
                     values: torch.Tensor) -> str:
        import torch

        reason = self._logits_unsupported(logits)
        if reason:
            return reason
        if expanded_idx_mapping.dtype not in (torch.int32, torch.int64) or (
            tuple(expanded_idx_mapping.shape) != (logits.shape[0],)
            or not expanded_idx_mapping.is_contiguous()
        ):
            return "request-state mapping layout or dtype"
        if values.dtype != torch.float32 or values.dim() != 1 or not values.is_contiguous():
            return f"{self.runner} values layout or dtype"
        return ""


class TemperatureRouter(_StateParamRouter):
    """MRV2's ``apply_temperature(logits, expanded_idx_mapping, temperature)``."""

    seam = "apply_temperature"
    runner = "temperature"

    def __init__(self, module: ModuleType, *, kernel: str = "temperature") -> None:
        super().__init__(module, kernel=kernel)

    def _configure_kernels(self) -> None:
        from spectune.kernels import apply_temperature
        from spectune.kernels.sampling import rows_problem

        super()._configure_kernels()
        self._launcher, self._problem_for = apply_temperature, rows_problem

    def apply_temperature(self, logits: torch.Tensor, expanded_idx_mapping: torch.Tensor,
                          temperature: torch.Tensor) -> None:
        """Drop-in for MRV2's ``apply_temperature`` (in place)."""
        self._state_call(logits, expanded_idx_mapping, temperature)


class MinPRouter(_StateParamRouter):
    """MRV2's ``apply_min_p(logits, expanded_idx_mapping, min_p)``."""

    seam = "apply_min_p"
    runner = "min-p"

    def __init__(self, module: ModuleType, *, kernel: str = "min_p") -> None:
        super().__init__(module, kernel=kernel)

    def _configure_kernels(self) -> None:
        from spectune.kernels import apply_min_p
        from spectune.kernels.sampling import rows_problem

        super()._configure_kernels()
        self._launcher, self._problem_for = apply_min_p, rows_problem

    def apply_min_p(self, logits: torch.Tensor, expanded_idx_mapping: torch.Tensor,
                    min_p: torch.Tensor) -> None:
        """Drop-in for MRV2's ``apply_min_p`` (in place)."""
        self._state_call(logits, expanded_idx_mapping, min_p)


class GumbelRouter(SamplingRouter):
    """MRV2's ``gumbel_sample`` (its sampler's and its drafters')."""

    seam = "gumbel_sample"
    runner = "Gumbel sampling"

    def __init__(self, module: ModuleType, *, kernel: str = "gumbel_sample") -> None:
        super().__init__(module, kernel=kernel)

    def _configure_kernels(self) -> None:
        from spectune.kernels import gumbel_sample
        from spectune.kernels.sampling import rows_problem

        super()._configure_kernels()
        self._launcher, self._problem_for = gumbel_sample, rows_problem

    def gumbel_sample(
        self,
        logits: torch.Tensor,
        expanded_idx_mapping: torch.Tensor,
        temperature: torch.Tensor,
        seed: torch.Tensor,
        pos: torch.Tensor,
        apply_temperature: bool,
        is_drafting: bool,
        logits_cache: torch.Tensor | None = None,
        logits_cache_col: torch.Tensor | None = None,
        use_fp64: bool = False,
        logits_cache_source: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Drop-in for MRV2's ``gumbel_sample`` (same arguments, same tokens)."""
        # vLLM makes these two contiguous itself; so does the drop-in.
        expanded_idx_mapping = expanded_idx_mapping.contiguous()
        pos = pos.contiguous()
        args = (logits, expanded_idx_mapping, temperature, seed, pos, apply_temperature,
                is_drafting, logits_cache, logits_cache_col, use_fp64, logits_cache_source)
        return self._call(logits, args, {}, lambda: self._unsupported(*args))

    def _unsupported(self, logits: torch.Tensor, expanded_idx_mapping: torch.Tensor,
                     temperature: torch.Tensor, seed: torch.Tensor, pos: torch.Tensor,
                     *rest: Any) -> str:
        import torch

        reason = self._logits_unsupported(logits)
        if reason:
            return reason
        if expanded_idx_mapping.dtype not in (torch.int32, torch.int64) or (
            pos.dtype not in (torch.int32, torch.int64)
        ):
            return "request-state mapping or position dtype"
        if temperature.dtype != torch.float32 or seed.dtype != torch.int64:
            return "temperature or seed dtype"
        cache, cache_col, cache_source = rest[2], rest[3], rest[5]
        if cache is not None:
            if cache.dtype not in self._logits_dtypes or cache.stride(-1) != 1:
                return "logits cache layout or dtype"
            source = logits if cache_source is None else cache_source
            if source.dtype != cache.dtype or source.stride(-1) != 1:
                return "logits cache source layout or dtype"
            if cache_col is None or cache_col.dtype not in (torch.int32, torch.int64):
                return "logits cache column dtype"
        return ""


#: (module, router class) of every V1 sampling seam.
V1_SAMPLING_SEAMS: tuple[tuple[str, type[SamplingRouter]], ...] = (
    (_TOPK_TOPP_SAMPLER, TopKTopPRouter),
    (_V1_REJECTION, TopKTopPRouter),
)
#: (module, router class) of every Model Runner V2 sampling seam.
MRV2_SAMPLING_SEAMS: tuple[tuple[str, type[SamplingRouter]], ...] = (
    (_MRV2_STATES, TopKTopPRouter),
    (_MRV2_SAMPLER, TopKTopPRouter),
    (_MRV2_STATES, TemperatureRouter),
    (_MRV2_STATES, MinPRouter),
    (_MRV2_SAMPLER, GumbelRouter),
    (_MRV2_SPECULATOR, GumbelRouter),
)


def sampling_routers(seams: tuple[tuple[str, type[SamplingRouter]], ...]) -> list[SamplingRouter]:
    """One router per seam, for the vLLM modules that exist and hold the name (a module
    or name vLLM moved is skipped: its calls stay vLLM's)."""
    import importlib

    routers = []
    for module_name, router_type in seams:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if callable(getattr(module, router_type.seam, None)):
            routers.append(router_type(module))
    return routers
