"""One routed verification call beside vLLM's own, for ``spectune doctor``.

Builds a small batch (greedy, seeded and unseeded random, and zero-draft requests; with
and without draft probabilities) and calls vLLM's V1 ``rejection_sample`` and the plugin's routed
replacement on the same inputs with the same generators. The tokens must be equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from spectune._vllm_route import Router

__all__ = ["SelfTest", "make_sampling_metadata", "run_self_test"]


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
    from spectune.vllm_plugin import platform_overrides_only

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
