"""``spectune doctor``'s checks: what the vLLM plugin would decide here, and a self-test.

:func:`diagnose` says what ``register()`` and a worker would decide on this machine,
without running vLLM. :func:`self_test` builds a small batch (greedy, seeded and unseeded
random, and zero-draft requests; with and without draft probabilities) and calls vLLM's V1
``rejection_sample`` and a router's replacement on the same inputs with the same
generators: the tokens must be equal.

This module uses the plugin (its settings, its configs seam, its router); the plugin never
imports it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from spectune.vllm._settings import (
    ENV_DISABLE,
    ENV_FORCE,
    disabled,
    forced,
    installed_vllm_version,
    supported_text,
    vllm_supported,
)

if TYPE_CHECKING:
    from spectune.vllm._v1_router import Router

__all__ = ["Diagnosis", "SelfTest", "diagnose", "make_sampling_metadata", "run_self_test",
           "self_test"]


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
    from spectune.identity import CPU_BACKEND, detect_software, use_interpreter
    from spectune.vllm._configs import TunedConfigs

    configs = TunedConfigs.load()
    identity, software = configs.device, detect_software()
    reasons: list[str] = []
    route = True
    version: str | None = None
    has_triton = False
    try:
        version = installed_vllm_version()
        from vllm.triton_utils import HAS_TRITON

        has_triton = bool(HAS_TRITON)
    except ImportError:
        pass
    supported = version is not None and vllm_supported(version)
    if disabled():
        route = False
        reasons.append(f"{ENV_DISABLE}=1: the plugin does nothing")
    if version is None:
        route = False
        reasons.append("vLLM is not installed")
    elif not supported:
        route = False
        reasons.append(f"vLLM {version} is not supported (spectune supports {supported_text()})")
    if identity.backend == CPU_BACKEND and not use_interpreter():
        route = False
        reasons.append("no GPU, and TRITON_INTERPRET is not set: Triton cannot run here")
    if configs.usable == 0:
        if forced():
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
    """Run a few verification calls through a router, beside vLLM's own function.

    The router uses the configs the plugin would load here (defaults where nothing is
    tuned), is not installed into vLLM, and is counted by
    :func:`spectune.vllm.routed_calls`. Needs vLLM, and Triton able to run (a GPU or
    ``TRITON_INTERPRET=1``).
    """
    import vllm.v1.sample.rejection_sampler as rs

    from spectune.identity import torch_device
    from spectune.vllm._configs import TunedConfigs
    from spectune.vllm._hook import new_router
    from spectune.vllm._settings import RNG_VLLM

    configs = TunedConfigs.load()
    # vLLM's random numbers: the tokens are compared with vLLM's, seeded or not.
    router = new_router(rs, rng=RNG_VLLM)
    router.configure(configs)
    return run_self_test(router, torch.device(torch_device(configs.backend)))


@dataclass(frozen=True)
class SelfTest:
    """Outcome of :func:`run_self_test`.

    Attributes:
        ok: Whether the routed calls ran and gave vLLM's tokens.
        routed: Calls that went through spectune's kernels.
        detail: One line: what was compared, or what went wrong.
    """

    ok: bool
    routed: int
    detail: str


def make_sampling_metadata(
    temperatures: list[float], generators: dict[int, torch.Generator], device: torch.device
) -> Any:
    """A real vLLM ``SamplingMetadata``: per-request temperatures, no penalties."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    batch = len(temperatures)
    return SamplingMetadata(
        temperature=torch.tensor(temperatures, dtype=torch.float32, device=device),
        all_greedy=all(t == 0 for t in temperatures),
        all_random=all(t > 0 for t in temperatures),
        top_p=None,
        top_k=None,
        generators=generators,
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch, device=device),
        presence_penalties=torch.zeros(batch, device=device),
        repetition_penalties=torch.ones(batch, device=device),
        output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def run_self_test(router: Router, device: torch.device) -> SelfTest:
    """Compare ``router``'s ``rejection_sample`` with vLLM's on ``device``. Never raises.

    ``router`` must be configured; its call counts include the routed calls made here.
    """
    start = router.stats.routed
    try:
        return _run(router, device, start)
    except Exception as exc:
        return SelfTest(ok=False, routed=router.stats.routed - start,
                        detail=f"{type(exc).__name__}: {exc}")


def _run(router: Router, device: torch.device, start: int) -> SelfTest:
    from spectune.vllm._hook import platform_overrides_only

    if device.type == "cpu":
        # vLLM's own path on CPU runs the platform's C++ fallbacks.
        platform_overrides_only()
    gen = torch.Generator().manual_seed(0)
    counts, vocab, k = [3, 0, 2, 3], 64, 3
    n_rows = sum(counts)
    logits = (torch.randn(n_rows, vocab, generator=gen) * 3).to(device)
    drafts = torch.randint(0, vocab, (n_rows,), generator=gen, dtype=torch.int32).to(device)
    cu = torch.tensor(counts).cumsum(0).to(torch.int32).to(device)
    bonus = torch.randint(0, vocab, (len(counts), 1), generator=gen).to(device)
    probs = torch.softmax(torch.randn(n_rows, vocab, generator=gen), -1).to(device)
    compared = 0
    for draft_probs in (None, probs):
        for temperatures in ([0.0] * 4, [1.0, 0.0, 1.0, 1.0]):
            outputs = []
            for fn in (router.original, router.rejection_sample):
                # Requests 0 and 2 are seeded; request 3 draws from the default generator,
                # whose state is set (and restored afterwards) so both calls see the same.
                generators = {
                    i: torch.Generator(device=device).manual_seed(7 + i) for i in (0, 2)
                }
                metadata = make_sampling_metadata(temperatures, generators, device)
                cuda = [device] if device.type == "cuda" else []
                with torch.random.fork_rng(devices=cuda):
                    torch.manual_seed(11)
                    outputs.append(fn(drafts, counts, k, cu, draft_probs, logits.clone(),
                                      bonus, metadata))
            if not torch.equal(outputs[0].cpu(), outputs[1].cpu()):
                return SelfTest(
                    ok=False, routed=router.stats.routed - start,
                    detail=f"tokens differ from vLLM's: {outputs[1].tolist()} vs "
                    f"{outputs[0].tolist()}",
                )
            compared += 1
    routed = router.stats.routed - start
    if routed != compared:
        return SelfTest(ok=False, routed=routed, detail="some calls were not routed")
    return SelfTest(
        ok=True, routed=routed,
        detail=f"{compared} routed calls gave vLLM's tokens (greedy, seeded and unseeded "
        "random, zero-draft; with and without draft probabilities)",
    )
