"""vLLM's sampling steps with and without spectune's routing, on the real vLLM.

The seams are the module-level names vLLM's callers look up at call time
(spectune/vllm/_sampling_routers.py). "Without" is vLLM's own function: its sort-based
``apply_top_k_top_p`` (what its CPU build runs) and, for Model Runner V2's Triton steps,
its kernels bound to the real Triton and run by the interpreter
(tests/kernels/vllm_mrv2.py). "With" is the router in its place, configured with no
tuned rows (default configs), called through vLLM's own code where it can be built on
this host: V1's ``TopKTopPSampler.forward_native`` and MRV2's ``Sampler._sample_random``
(whose ``self`` is a stand-in holding the sampling-state tensors: vLLM's
``SamplingStates`` allocates pinned memory, which needs an accelerator).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import vllm.v1.sample.ops.topk_topp_sampler as v1_topk
import vllm.v1.sample.rejection_sampler as v1_rs
import vllm.v1.worker.gpu.sample.sampler as mrv2_sampler
import vllm.v1.worker.gpu.sample.states as mrv2_states
import vllm.v1.worker.gpu.spec_decode.speculator as mrv2_speculator

from spectune.identity import detect_device
from spectune.kernels.sampling import top_k_top_p_reference, top_k_top_p_results_agree
from spectune.vllm._configs import TunedConfigs
from spectune.vllm._mrv2_router import Mrv2Router
from spectune.vllm._sampling_routers import (
    MRV2_SAMPLING_SEAMS,
    V1_SAMPLING_SEAMS,
    SamplingRouter,
    TopKTopPRouter,
    sampling_routers,
)
from spectune.vllm._v1_router import Router
from tests.kernels.vllm_mrv2 import load_vllm_mrv2
from tests.vllm.conftest import needs_kernels, plugin_records

pytestmark = [
    pytest.mark.vllm,
    needs_kernels,
    pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning"),
]

@pytest.fixture
def plugin_log() -> Iterator[list[logging.LogRecord]]:
    """Records of the plugin's logger, every level."""
    with plugin_records(level=logging.DEBUG) as records:
        yield records


NO_TUNING = TunedConfigs(device=detect_device(), lookup=lambda kernel, problem: None,
                         description="none", usable=0, forced=True)


@pytest.mark.parametrize("seams", [V1_SAMPLING_SEAMS, MRV2_SAMPLING_SEAMS], ids=["v1", "mrv2"])
def test_every_seam_exists_with_vllms_parameters(seams: tuple) -> None:
    """The installed vLLM holds every name routed, with the parameters the drop-in takes
    (a vLLM upgrade that moves one fails here, not silently in an engine); the drop-in's
    further parameters (another release's) have defaults."""
    routers = sampling_routers(seams)
    assert len(routers) == len(seams)
    for router in routers:
        theirs = list(inspect.signature(getattr(router.module, router.seam)).parameters)
        params = inspect.signature(getattr(router, router.seam)).parameters
        ours = list(params)
        assert ours[:len(theirs)] == theirs, (router.where, ours, theirs)
        assert all(params[name].default is not inspect.Parameter.empty
                   for name in ours[len(theirs):]), (router.where, ours, theirs)


@pytest.fixture
def leader() -> Iterator[Router]:
    """A V1 verification router (never called here) leading the routers under test."""
    router = Router(v1_rs)
    yield router
    router.uninstall()


def lead(leader: Router, *companions: SamplingRouter) -> None:
    for companion in companions:
        leader.add_companion(companion)
    leader.install()
    leader.configure(NO_TUNING)


def v1_case(rows: int, vocab: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor,
                                                           torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    k = torch.randint(1, vocab + 1, (rows,), generator=gen).to(torch.int32)
    k[0] = vocab
    p = torch.rand(rows, generator=gen) * 0.9 + 0.1
    return logits, k, p


def test_v1_sampler_gives_the_same_tokens_through_the_router(leader: Router) -> None:
    """V1's sampler (its native path: mask, softmax, exponential race with per-request
    generators): the same tokens and processed logits with the router in place."""
    sampler = v1_topk.TopKTopPSampler(logprobs_mode="processed_logits")
    logits, k, p = v1_case(6, 300, seed=1)

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        generators = {i: torch.Generator().manual_seed(100 + i) for i in range(6)}
        tokens, processed = sampler.forward_native(logits.clone(), generators, k, p)
        assert processed is not None
        return tokens, processed

    theirs, their_logits = run()
    router = TopKTopPRouter(v1_topk)
    lead(leader, router)
    assert v1_topk.apply_top_k_top_p == router.apply_top_k_top_p
    ours, our_logits = run()
    assert router.stats.routed == 1
    ref = top_k_top_p_reference(logits, k, p)
    assert top_k_top_p_results_agree(ref, our_logits) == (True, "")
    assert top_k_top_p_results_agree(ref, their_logits) == (True, "")
    same_mask = torch.equal(torch.isinf(our_logits), torch.isinf(their_logits))
    assert same_mask and torch.equal(ours, theirs)
    leader.uninstall()
    assert v1_topk.apply_top_k_top_p is router.original


def test_unsupported_calls_go_to_vllm_and_are_counted(leader: Router) -> None:
    router = TopKTopPRouter(v1_rs)
    lead(leader, router)
    logits, k, p = v1_case(3, 64, seed=2)
    expected = router.original(logits.double().clone(), k, p)
    got = v1_rs.apply_top_k_top_p(logits.double().clone(), k, p)
    assert torch.equal(got, expected)
    got = v1_rs.apply_top_k_top_p(logits.clone(), k.float(), p)
    assert router.stats.routed == 0
    assert router.stats.passed_reasons == {"torch.float64 logits": 1,
                                           "top-k tensor layout or dtype": 1}


def test_a_failing_routed_call_falls_back_and_never_raises(
    leader: Router, plugin_log: list[logging.LogRecord]
) -> None:
    router = TopKTopPRouter(v1_rs)
    lead(leader, router)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("no such kernel")

    router._launcher = broken
    logits, k, p = v1_case(3, 64, seed=3)
    expected = router.original(logits.clone(), k, p)
    got = v1_rs.apply_top_k_top_p(logits.clone(), k, p)
    assert torch.equal(got, expected)
    assert not router.installed  # vLLM's function from now on
    assert leader.installed  # the verification router is not affected
    warnings = [r.getMessage() for r in plugin_log if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "apply_top_k_top_p failed" in warnings[0]
    assert "RuntimeError: no such kernel" in warnings[0]


# --------------------------------------------------------------------------------------
# Model Runner V2: temperature and min-p (states), top-k/top-p and Gumbel (sampler)
# --------------------------------------------------------------------------------------

STATES = 5


@pytest.fixture
def mrv2_seams(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's MRV2 modules with runnable functions at the seams (their Triton kernels
    bound to the real Triton), restored afterwards."""
    vllm = load_vllm_mrv2()
    monkeypatch.setattr(mrv2_states, "apply_temperature", vllm.gumbel.apply_temperature)
    monkeypatch.setattr(mrv2_states, "apply_min_p", vllm.min_p.apply_min_p)
    monkeypatch.setattr(mrv2_sampler, "gumbel_sample", vllm.gumbel.gumbel_sample)
    monkeypatch.setattr(mrv2_speculator, "gumbel_sample", vllm.gumbel.gumbel_sample)


def mrv2_case(rows: int, vocab: int, *, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "logits": torch.randn(rows, vocab, generator=gen) * 3,
        "mapping": torch.randint(0, STATES, (rows,), generator=gen).to(torch.int32),
        "temperature": torch.tensor([0.8, 0.0, 1.0, 1.5, 0.6]),
        "min_p": torch.tensor([0.05, 0.0, 0.1, 0.0, 0.2]),
        "top_k": torch.tensor([50, vocab, 5, vocab, 20], dtype=torch.int32),
        "top_p": torch.tensor([0.9, 1.0, 1.0, 0.8, 0.95]),
        "seed": torch.randint(0, 2**62, (STATES,), generator=gen),
        "pos": torch.randint(0, 2**20, (rows,), generator=gen),
    }


def mrv2_sample(case: dict[str, torch.Tensor]) -> torch.Tensor:
    """What MRV2's ``Sampler.sample`` runs for a batch needing processing: temperature
    and min-p through the states module's names, then the real ``_sample_random``."""
    logits = case["logits"].clone()
    mapping = case["mapping"]
    mrv2_states.apply_temperature(logits, mapping, case["temperature"])
    mrv2_states.apply_min_p(logits, mapping, case["min_p"])
    stand_in = SimpleNamespace(
        sampling_states=SimpleNamespace(temperature=SimpleNamespace(gpu=case["temperature"]),
                                        seeds=SimpleNamespace(gpu=case["seed"])),
        use_fp64_gumbel=False,
    )
    top_k = case["top_k"][mapping.long()]
    top_p = case["top_p"][mapping.long()]
    sampled, _ = mrv2_sampler.Sampler._sample_random(
        stand_in, logits, mapping, np.asarray(mapping), case["pos"], top_k, top_p, False)
    return sampled


def test_mrv2_sampling_gives_vllms_tokens_through_the_routers(
    mrv2_seams: None, leader: Router
) -> None:
    routers = {router.where: router for router in sampling_routers(MRV2_SAMPLING_SEAMS)}
    cases = [mrv2_case(rows, vocab, seed=rows + vocab)
             for rows, vocab in ((7, 97), (5, 1000), (3, 4099))]
    theirs = [mrv2_sample(case) for case in cases]
    lead(leader, *routers.values())
    ours = [mrv2_sample(case) for case in cases]
    for mine, their in zip(ours, theirs, strict=True):
        assert torch.equal(mine, their)
    routed = {where: router.stats.routed for where, router in routers.items()}
    assert routed == {
        f"{mrv2_states.__name__}.apply_top_k_top_p": 0,  # Sampler.sample skips it
        f"{mrv2_sampler.__name__}.apply_top_k_top_p": 3,
        f"{mrv2_states.__name__}.apply_temperature": 3,
        f"{mrv2_states.__name__}.apply_min_p": 3,
        f"{mrv2_sampler.__name__}.gumbel_sample": 3,
        f"{mrv2_speculator.__name__}.gumbel_sample": 0,
    }


def test_the_log_line_names_the_sampling_steps(
    monkeypatch: pytest.MonkeyPatch, plugin_log: list[logging.LogRecord]
) -> None:
    import vllm.v1.worker.gpu.spec_decode.rejection_sampler as mrv2_rs

    monkeypatch.setenv("SPECTUNE_FORCE", "1")
    router = Mrv2Router(mrv2_rs)
    for companion in sampling_routers(MRV2_SAMPLING_SEAMS):
        router.add_companion(companion)
    router.install()
    try:
        assert router.activate(torch.device("cpu"))
        line = plugin_log[-1].getMessage()
        assert ("with its sampling steps: top-k/top-p (x2), temperature, min-p, "
                "Gumbel sampling (x2)") in line
        assert all(c.configured and c.installed for c in router.companions)
    finally:
        router.uninstall()
    assert not any(c.installed for c in router.companions)
    modules: list[ModuleType] = [mrv2_states, mrv2_sampler, mrv2_speculator]
    assert all(not hasattr(getattr(m, name), "__self__") for m in modules
               for name in ("apply_top_k_top_p", "gumbel_sample") if hasattr(m, name))
