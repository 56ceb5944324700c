"""What every router shares: one vLLM function (the seam) routed to one kernel family.

A router replaces a module-level function of vLLM (``rejection_sample`` of the V1
sampler, or of Model Runner V2's) with a bound method of its own, built once per engine
with its kernel family's name. :meth:`SeamRouter.activate` identifies the device and
loads the tuned configs (:class:`spectune.vllm._configs.TunedConfigs`), then routes or
hands vLLM its function back, and logs one line. Each call looks its launch config up
once per shape; a call the family does not implement goes to vLLM's function, counted
with its reason; whatever fails is logged once and vLLM's function is used from then on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from spectune.messages import one_line
from spectune.vllm._settings import ENV_FORCE, logger

if TYPE_CHECKING:
    import torch

    from spectune.kernels import KernelFamily
    from spectune.space import Problem
    from spectune.vllm._configs import TunedConfigs

__all__ = ["PassToVllm", "RouterStats", "SeamRouter", "router_of", "unwrap"]


class RouterStats:
    """What a router did.

    Plain classes here, not dataclasses: this module is imported on vLLM's worker
    start-up path, where generating dataclass methods costs milliseconds.

    Attributes:
        routed: Verification calls that ran spectune's kernels.
        passed: Calls handed to vLLM's original function (not implemented by spectune).
        passed_reasons: ``passed`` by reason (``"block verification"``, ...).
        tuned_shapes: Shapes seen that had a tuned config.
        default_shapes: Shapes seen that used the kernels' default config.
    """

    __slots__ = ("default_shapes", "passed", "passed_reasons", "routed", "tuned_shapes")

    def __init__(self) -> None:
        self.routed = 0
        self.passed = 0
        self.passed_reasons: dict[str, int] = {}
        self.tuned_shapes = 0
        self.default_shapes = 0

    def __repr__(self) -> str:
        return (f"RouterStats(routed={self.routed}, passed={self.passed}, "
                f"tuned_shapes={self.tuned_shapes}, default_shapes={self.default_shapes})")

    def count_passed(self, reason: str) -> None:
        """One call handed to vLLM, for ``reason``."""
        self.passed += 1
        self.passed_reasons[reason] = self.passed_reasons.get(reason, 0) + 1


class SeamRouter:
    """Routes the function ``module.<seam>`` of vLLM to one spectune kernel family.

    Subclasses name the seam and the runner, and implement the drop-in function.

    Args:
        module: The vLLM module whose function is replaced.
        kernel: Name of the kernel family that runs the calls.

    Attributes:
        seam: Name of the replaced function in ``module``.
        runner: What the log line says was routed.
        configs: The tuned configs in use, once :meth:`configure` (or
            :meth:`activate`) has set them.
        stats: What the router did.
    """

    seam = "rejection_sample"
    runner = ""

    def __init__(self, module: ModuleType, *, kernel: str) -> None:
        self.module = module
        self.kernel = kernel
        self.configs: TunedConfigs | None = None
        self.stats = RouterStats()
        self._family: KernelFamily | None = None
        self._original: Callable[..., Any] | None = None
        # A shape's config, or why it goes to vLLM.
        self._shape_configs: dict[Hashable, dict[str, int] | str] = {}
        self._failed = False
        # Configured, and what the hot path needs of the kernels taken: one attribute
        # read per call once routing.
        self._live = False
        self._lock = threading.Lock()
        self.companions: list[SeamRouter] = []
        self.leader: SeamRouter | None = None

    def __repr__(self) -> str:
        state = "configured" if self.configured else "not configured"
        return f"{type(self).__name__}({state}, installed={self.installed}, {self.stats})"

    # ------------------------------------------------------------------ install

    def _drop_in(self) -> Callable[..., Any]:
        """The bound method that stands in for vLLM's function."""
        return getattr(self, self.seam)

    @property
    def installed(self) -> bool:
        """Whether vLLM's function is currently this router's."""
        return router_of(getattr(self.module, self.seam)) is self

    @property
    def original(self) -> Callable[..., Any]:
        """vLLM's own function."""
        if self._original is not None:
            return self._original
        return unwrap(getattr(self.module, self.seam))

    def add_companion(self, companion: SeamRouter) -> None:
        """Route another of vLLM's functions along with this one (the sampling steps
        around a verification): installed, configured and given back with this router,
        activated by its first call or this router's; counted on its own."""
        companion.leader = self
        self.companions.append(companion)

    @property
    def families(self) -> tuple[str, ...]:
        """The kernel families this router and its companions launch, in order (what
        their tuned configs are looked up for)."""
        names = (self.kernel, *(c.kernel for c in self.companions))
        return tuple(dict.fromkeys(names))

    def install(self) -> None:
        """Put the drop-in in place of vLLM's function (idempotent), companions too."""
        current = getattr(self.module, self.seam)
        if router_of(current) is not self:
            self._original = unwrap(current)
            setattr(self.module, self.seam, self._drop_in())
        for companion in self.companions:
            companion.install()

    def uninstall(self) -> None:
        """Give vLLM back its own function (idempotent), companions too."""
        if self.installed:
            setattr(self.module, self.seam, self.original)
        for companion in self.companions:
            companion.uninstall()

    @property
    def where(self) -> str:
        """The replaced function's full name (``module.seam``)."""
        return f"{self.module.__name__}.{self.seam}"

    @property
    def configured(self) -> bool:
        """Whether :meth:`configure` has set the tuned configs and the kernel family."""
        return self._family is not None

    def configure(self, configs: TunedConfigs, *, kernels: bool = True) -> None:
        """Use ``configs`` (and forget cached per-shape configs), companions too.

        Args:
            configs: The tuned configs.
            kernels: Take from the kernel package now what the hot path needs
                (:meth:`_configure_kernels`: limits, input types, launchers); ``False``:
                at the first call (:meth:`activate`, on vLLM's worker start-up path).
                The family's kernels themselves are imported by neither: the worker hook
                imports them in the background (:func:`spectune.kernels.preload`), and
                the first launch imports whatever is left.
        """
        from spectune.kernels import get_family

        self._live = False
        self._family = get_family(self.kernel)
        self.configs = configs
        self._shape_configs.clear()
        if kernels:
            self._take_kernels()
        for companion in self.companions:
            companion.configure(configs, kernels=kernels)

    def _take_kernels(self) -> None:
        """Take what the hot path needs from the kernel package (imports what it names)."""
        self._configure_kernels()
        self._live = True

    def _configure_kernels(self) -> None:
        """Subclasses: take what the hot path needs from the (now imported) kernels."""

    def _route_extras(self) -> str:
        """Subclasses: route more than the seam; returns what to add to the log line."""
        return ""

    def activate(self, device: torch.device) -> bool:
        """Identify ``device``, load its tuned configs, and route or step aside.

        With no tuned config on the device measured faster than the installed vLLM's
        own function (and no ``SPECTUNE_FORCE=1``), vLLM's functions are given back:
        spectune routes only where it was shown to win. Logs one line either way.

        Returns:
            Whether the router routes from now on.

        Raises:
            Exception: whatever identifying the device or importing the kernels raised;
                the caller uninstalls and reports it.
        """
        from spectune.vllm._configs import TunedConfigs

        configs = TunedConfigs.load(device, families=self.families)
        versus = f"vLLM {configs.vllm_version or '(version unknown)'}"
        if configs.faster == 0 and not configs.forced:
            self.uninstall()
            logger.warning("%s; %d tuned configs usable here, none measured faster than "
                           "%s; nothing routed (%s=1 routes with default configs)",
                           configs.describe(), configs.usable, versus, ENV_FORCE)
            return False
        self.configure(configs, kernels=False)  # the first call takes them
        routed = self.runner + self._route_extras()
        if configs.forced:
            where = f"every shape ({ENV_FORCE}=1)"
        else:
            where = "those shapes; the rest go to vLLM"
        logger.info("%s; %d tuned configs usable here, %d faster than %s; routed %s to "
                    "spectune kernels for %s (%s)%s", configs.describe(), configs.usable,
                    configs.faster, versus, routed, where, self._details(),
                    self._companions_text())
        return True

    def _companions_text(self) -> str:
        """The log line's tail: the sampling steps routed with this router."""
        names: dict[str, int] = {}
        for companion in self.companions:
            if companion.installed:
                names[companion.runner] = names.get(companion.runner, 0) + 1
        if not names:
            return ""
        listed = ", ".join(f"{name} (x{n})" if n > 1 else name for name, n in names.items())
        return f"; with its sampling steps: {listed}"

    def _details(self) -> str:
        """The log line's last words: the family and how it draws random numbers."""
        return f"family {self.kernel}"

    # ------------------------------------------------------------------ calls

    def _ready(self, device: torch.device) -> bool:
        """Whether this call can be routed: activates the router at its first call, and
        takes what the hot path needs of the kernels."""
        if self._live:
            return True
        if not self.configured:
            (self.leader or self)._first_call(device)
            if not self.configured:
                return False
        with self._lock:
            if not self._live and not self._failed:
                try:
                    self._take_kernels()
                except Exception as exc:
                    self._fail("routing not set up at the first verification call", exc)
        return self._live and self.installed

    def _route(
        self,
        device: torch.device,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        why_not: Callable[[], str],
        prepare: Callable[[], tuple[Any, dict[str, int]]],
        fallback: Callable[[], Any] | None = None,
    ) -> Any:
        """One call of the drop-in: the family's kernels, or vLLM's function when the
        router is not active, the call is not implemented (``why_not()`` says why,
        counted) or anything spectune does fails (vLLM's function from then on).

        Args:
            device: Where the call's tensors are (activates the router at its first call).
            args: The call's positional arguments, as vLLM passed them.
            kwargs: The call's keyword arguments, as vLLM's function takes them.
            why_not: Why the family does not implement this call (empty: it does).
            prepare: The family's inputs and launch config for this call.
            fallback: What runs instead when the call is not routed (default: vLLM's
                function with ``args`` and ``kwargs``).
        """
        original = self.original
        if fallback is None:
            fallback = lambda: original(*args, **kwargs)  # noqa: E731
        if not self._ready(device):
            return fallback()
        reason = why_not()
        if reason:
            self.stats.count_passed(reason)
            return fallback()
        family = self._family
        assert family is not None
        try:
            inputs, config = prepare()
            out = self._launch(family, inputs, config)
        except PassToVllm as passed:
            # Not faster than vLLM here (or not shown to be): vLLM's own function.
            self.stats.count_passed(passed.reason)
            return fallback()
        except Exception as exc:
            self._fail(f"a routed call of {self.where} failed", exc)
            return fallback()
        self.stats.routed += 1
        return out

    def _launch(self, family: KernelFamily, inputs: Any, config: dict[str, int]) -> Any:
        """Run one routed call (the family's launch; subclasses may call a launcher)."""
        return family.launch(inputs, config)

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

    def config_of(
        self, key: Hashable, problem_of: Callable[[], Problem], *,
        family: KernelFamily | None = None,
    ) -> dict[str, int]:
        """Launch config of a shape ``key``: the database row's, when that row says
        spectune's config is faster than the installed vLLM's own function here.
        Asked once per shape (``problem_of`` builds its problem), then cached.
        ``family``: another family than the router's (its folded variant).

        Raises:
            PassToVllm: no such row; the call goes to vLLM, counted with the reason
                (``no row``, ``vllm faster here``, ``not measured against vLLM``). With
                ``SPECTUNE_FORCE=1`` every shape is routed instead: the row's config,
                else the family's default.
        """
        if family is not None:
            key = (family.name, key)
        config = self._shape_configs.get(key)
        if config is not None:
            if isinstance(config, str):
                raise PassToVllm(config)
            return config
        family, configs = family or self._family, self.configs
        assert family is not None and configs is not None
        problem = problem_of()
        entry = configs.entry(family.name, problem)
        if entry is not None and (configs.forced or configs.serves(entry)):
            self.stats.tuned_shapes += 1
            config = dict(entry.config)
        elif configs.forced:
            self.stats.default_shapes += 1
            config = family.default_config(problem, configs.backend)
        else:
            reason = configs.why_vllm(entry)
            self._shape_configs[key] = reason
            raise PassToVllm(reason)
        self._shape_configs[key] = config
        return config


class PassToVllm(Exception):  # a decision, not an error
    """This call goes to vLLM's own function, for :attr:`reason` (counted)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def router_of(function: Any) -> SeamRouter | None:
    """The router whose drop-in ``function`` is: a bound method, or a function that
    stands in for a method of a vLLM class (``__spectune_router__``)."""
    owner = getattr(function, "__self__", None)
    if not isinstance(owner, SeamRouter):
        owner = getattr(function, "__spectune_router__", None)
    return owner if isinstance(owner, SeamRouter) else None


def unwrap(function: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's function behind a (possibly stale) router's drop-in."""
    owner = router_of(function)
    if owner is not None:
        return owner.original
    return function
