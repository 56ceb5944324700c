"""``spectune doctor``'s checks: what the vLLM plugin would decide here, and a self-test.

:func:`diagnose` says what ``register()`` and a worker would decide on this machine,
without running vLLM, and which runner's verification would be routed.
:func:`self_test` runs each router on a small batch (greedy, random, zero-draft
requests; with and without draft probabilities or logits) beside what vLLM computes:
the V1 router beside vLLM's V1 ``rejection_sample`` with the same generators; the Model
Runner V2 router beside vLLM's MRV2 ``rejection_sample`` where vLLM's Triton kernels run
(a GPU), else beside spectune's PyTorch reference of it (MRV2 needs Triton, so a CPU
vLLM never runs it). The tokens must be equal.

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
    from spectune.vllm._mrv2_router import Mrv2Router
    from spectune.vllm._v1_router import Router

__all__ = ["Diagnosis", "SelfTest", "diagnose", "make_sampling_metadata",
           "run_mrv2_self_test", "run_self_test", "self_test"]


@dataclass
class Diagnosis:
    """What the plugin would do in a vLLM worker started like this process.

    Attributes:
        device: Device identity, one line.
        software: Triton, torch, runtime and spectune versions.
        database: Databases read and what they hold.
        usable: Tuned configs usable on this device.
        faster: Of those, how many were measured faster than the installed vLLM.
        vllm_version: Installed vLLM version (``None`` when vLLM is not installed).
        vllm_supported: Whether that version is supported.
        would_route: Whether a worker would route its verification to spectune.
        runner: The model runner a vLLM engine would verify with here (Model Runner V2
            where vLLM's Triton works and ``VLLM_USE_V2_MODEL_RUNNER`` is not 0, else
            V1), and the kernel family that verifies for it.
        reasons: Why (or why not), one line each.
    """

    device: str
    software: dict[str, object]
    database: str
    usable: int
    vllm_version: str | None
    vllm_supported: bool
    would_route: bool
    runner: str = ""
    faster: int = 0
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
    versus = f"vLLM {version}" if version else "the installed vLLM"
    if configs.usable == 0:
        if forced():
            reasons.append(f"no tuned configs usable here; {ENV_FORCE}=1 routes with defaults")
        else:
            route = False
            reasons.append(f"no tuned configs usable here ({ENV_FORCE}=1 routes with defaults)")
    elif configs.faster == 0 and not forced():
        route = False
        reasons.append(
            f"{configs.usable} tuned configs usable here, none measured faster than "
            f"{versus} (`spectune sweep` or `spectune nightly` measures them; "
            f"{ENV_FORCE}=1 routes anyway)")
    else:
        reasons.append(
            f"{configs.usable} tuned configs usable here, {configs.faster} measured faster "
            f"than {versus}: only their shapes are routed; every other call goes to vLLM, "
            "counted by reason (no row, vllm faster here, not measured against vLLM)"
            if not forced() else
            f"{configs.usable} tuned configs usable here; {ENV_FORCE}=1 routes every shape "
            "(verdicts against vLLM ignored)")
    from spectune.vllm._mrv2_router import MRV2_KERNEL
    from spectune.vllm._v1_router import V1_KERNEL

    env_runner = os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "")
    mrv2 = env_runner == "1" or (has_triton and env_runner != "0")
    if mrv2:
        runner = f"Model Runner V2 (family {MRV2_KERNEL})"
    else:
        runner = f"V1 (family {V1_KERNEL})"
    if supported and not disabled():
        seams_ok, seams_reasons = _seams_verdict(version, mrv2=mrv2)
        route = route and seams_ok
        reasons += seams_reasons
    if route:
        reasons.append(
            f"a worker with speculative decoding routes its verification (either runner; "
            f"here {runner})"
        )
        reasons.append(_sampling_text(mrv2=mrv2))
        reasons.append(
            "handed to vLLM per call and counted (not implemented by spectune): block "
            "verification, synthetic acceptance, watermarking, a draft vocabulary narrower "
            "than the target's"
        )
    return Diagnosis(
        device=identity.describe(),
        software=software.as_dict(),
        database=configs.description,
        usable=configs.usable,
        faster=configs.faster,
        vllm_version=version,
        vllm_supported=supported,
        would_route=route,
        runner=runner,
        reasons=reasons,
    )


def _seams_verdict(version: str | None, *, mrv2: bool) -> tuple[bool, list[str]]:
    """Whether the engine start check (:func:`spectune.vllm.seams.admit`) would let the
    runner's verification route, and what it would say."""
    from spectune.vllm import seams
    from spectune.vllm._settings import folding_routed, sampling_routed

    verification = seams.MRV2 if mrv2 else seams.V1
    families = [verification]
    if sampling_routed():
        families += ([seams.TOP_K_TOP_P, seams.TEMPERATURE, seams.MIN_P, seams.GUMBEL]
                     if mrv2 else [seams.TOP_K_TOP_P])
        if folding_routed():
            families.append(seams.MRV2_FOLDED if mrv2 else seams.V1_FOLDED)
    refused = seams.refused_seams(families, version=version)
    if not refused:
        release = seams.registered_release(version, seams.load_registry())
        return True, [f"vLLM {version}'s seams are vLLM {release}'s, which spectune "
                      "implements (spectune doctor --vllm-seams lists them)"]
    kept_by_vllm = [family for family in families if any(
        family in seam.families for seam in seams.SEAMS if seam.name in refused)]
    lines = [seams.visible(f"vLLM {version}: {seams.summary(refused, version=version)}")]
    if verification in kept_by_vllm:
        return False, [*lines, "so a worker would step aside: vLLM runs unchanged"]
    return True, [*lines, f"so vLLM keeps its own {', '.join(kept_by_vllm)}"]


def _sampling_text(*, mrv2: bool) -> str:
    """What the verification's sampling companions would route here."""
    from spectune.vllm._sampling_routers import (
        MRV2_SAMPLING_SEAMS,
        V1_SAMPLING_SEAMS,
        sampling_routers,
    )
    from spectune.vllm._settings import ENV_SAMPLING, sampling_routed

    if not sampling_routed():
        return f"sampling steps left to vLLM ({ENV_SAMPLING}=0)"
    from spectune.vllm._fold_routers import fold_router
    from spectune.vllm._settings import ENV_FOLD, folding_routed

    routers = sampling_routers(MRV2_SAMPLING_SEAMS if mrv2 else V1_SAMPLING_SEAMS)
    listed = ", ".join(f"{r.where} ({r.kernel})" for r in routers)
    text = f"with its sampling steps: {listed or 'none found in this vLLM'}"
    if not folding_routed():
        return f"{text}; sampling parameters applied before verification ({ENV_FOLD}=0)"
    folder = fold_router(mrv2=mrv2)
    if folder is None:
        return f"{text}; no seam to fold the sampling parameters at in this vLLM"
    return (f"{text}; sampling parameters folded into verification at {folder.where} "
            f"({folder.kernel})")


def self_test() -> list[SelfTest]:
    """Run a few verification calls through each router, beside what vLLM computes.

    The routers use the configs the plugin would load here (defaults where nothing is
    tuned), are not installed into vLLM, and are counted by
    :func:`spectune.vllm.routed_calls`. Needs vLLM, and Triton able to run (a GPU or
    ``TRITON_INTERPRET=1``).

    Returns:
        The V1 router's outcome, then Model Runner V2's.
    """
    import importlib

    import vllm.v1.sample.rejection_sampler as rs

    from spectune.identity import torch_device
    from spectune.vllm._configs import TunedConfigs
    from spectune.vllm._hook import new_mrv2_router, new_router
    from spectune.vllm._mrv2_router import MRV2_MODULE
    from spectune.vllm._settings import RNG_VLLM

    configs = TunedConfigs.load()
    # The self-test checks spectune's kernels against vLLM's tokens: every shape goes
    # through them, whatever the rows' verdicts against vLLM.
    configs.forced = True
    device = torch.device(torch_device(configs.backend))
    # vLLM's random numbers: the tokens are compared with vLLM's, seeded or not.
    router = new_router(rs, rng=RNG_VLLM)
    router.configure(configs)
    mrv2 = new_mrv2_router(importlib.import_module(MRV2_MODULE))
    mrv2.configure(configs)
    return [run_self_test(router, device), run_mrv2_self_test(mrv2, device)]


@dataclass(frozen=True)
class SelfTest:
    """Outcome of :func:`run_self_test` or :func:`run_mrv2_self_test`.

    Attributes:
        ok: Whether the routed calls ran and gave vLLM's tokens.
        routed: Calls that went through spectune's kernels.
        detail: One line: what was compared, or what went wrong.
        runner: The model runner whose verification was tested.
    """

    ok: bool
    routed: int
    detail: str
    runner: str = "V1"


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


def run_mrv2_self_test(router: Mrv2Router, device: torch.device) -> SelfTest:
    """Compare ``router``'s MRV2 ``rejection_sample`` with vLLM's (where its Triton
    kernels run) or with the PyTorch reference (elsewhere). Never raises.

    ``router`` must be configured; its call counts include the routed calls made here.
    """
    start = router.stats.routed
    runner = "Model Runner V2"
    try:
        return _run_mrv2(router, device, start)
    except Exception as exc:
        return SelfTest(ok=False, routed=router.stats.routed - start,
                        detail=f"{type(exc).__name__}: {exc}", runner=runner)


def _run_mrv2(router: Mrv2Router, device: torch.device, start: int) -> SelfTest:
    from vllm.triton_utils import HAS_TRITON

    from spectune.kernels.rejection_mrv2 import mrv2_results_agree, rejection_sample_mrv2_reference

    runner = "Model Runner V2"
    gen = torch.Generator().manual_seed(0)
    # Requests: 3 drafts, none (bonus only), 2 drafts with a placeholder, 3 drafts.
    counts, vocab, k, states = [4, 1, 3, 4], 64, 3, 6
    rows = sum(counts)
    cu = torch.tensor([0, *counts]).cumsum(0).to(torch.int32)
    idx_mapping = torch.tensor([4, 0, 2, 5], dtype=torch.int32)
    drafts = torch.randint(0, vocab, (rows,), generator=gen)
    drafts[int(cu[2]) + 2] = -1
    args = {
        "target_logits": torch.randn(rows, vocab, generator=gen) * 3,
        "draft_sampled": drafts,
        "cu_num_logits": cu,
        "pos": torch.arange(100, 100 + rows, dtype=torch.int64),
        "idx_mapping": idx_mapping,
        "expanded_idx_mapping": idx_mapping.repeat_interleave(torch.tensor(counts)),
        "expanded_local_pos": torch.cat([torch.arange(c) for c in counts]).to(torch.int32),
        "seed": torch.arange(states, dtype=torch.int64) * 7919 + 17,
        "num_speculative_steps": k,
    }
    draft_logits = torch.randn(states, k, vocab, generator=gen) * 3
    oracle = "vLLM's MRV2 kernels" if HAS_TRITON else "spectune's PyTorch reference"
    compared = 0
    for with_draft in (False, True):
        for temperatures in ([0.0] * states, [1.0, 0.0, 0.7, 0.0, 1.0, 2.0]):
            call = {
                name: value.to(device) if isinstance(value, torch.Tensor) else value
                for name, value in args.items()
            }
            call["draft_logits"] = draft_logits.to(device) if with_draft else None
            call["temperature"] = torch.tensor(temperatures, dtype=torch.float32, device=device)
            ours = router.rejection_sample(**call)
            if HAS_TRITON:
                theirs = router.original(**call)
                n = theirs[1].cpu()
                same = torch.equal(ours[1].cpu(), n) and all(
                    torch.equal(ours[0][i, : n[i]].cpu(), theirs[0][i, : n[i]].cpu())
                    for i in range(len(counts))
                )
                why = "" if same else f"{ours[0].tolist()} vs {theirs[0].tolist()}"
            else:
                ref = rejection_sample_mrv2_reference(**call)
                same, why = mrv2_results_agree(ref, ours)
            if not same:
                return SelfTest(ok=False, routed=router.stats.routed - start, runner=runner,
                                detail=f"tokens differ from {oracle}: {why}")
            compared += 1
    routed = router.stats.routed - start
    if routed != compared:
        return SelfTest(ok=False, routed=routed, runner=runner,
                        detail="some calls were not routed")
    return SelfTest(
        ok=True, routed=routed, runner=runner,
        detail=f"{compared} routed calls gave the tokens of {oracle} (greedy and random "
        "requests, a placeholder draft, a request without drafts; with and without draft "
        "logits)",
    )
