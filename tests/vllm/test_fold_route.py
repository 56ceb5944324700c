"""Folded verification routed into the real vLLM: the same tokens as vLLM's "apply the
sampling parameters, then verify".

V1: through vLLM's own ``RejectionSampler.forward``; "without" is vLLM's
``apply_sampling_constraints`` (its top-k/top-p the sort-based PyTorch one on this host)
and vLLM's ``rejection_sample`` (the CPU platform's C++ kernels); "with" is spectune's
verification router with the fold companion deferring ``apply_sampling_constraints``.

Model Runner V2: through a real MRV2 ``RejectionSampler._verify``. Its ``Sampler`` cannot
be built on a host without an accelerator (pinned memory), so the sampler is a stand-in
holding what vLLM's sampling states hold, whose ``apply_sampling_params`` is vLLM's own
method (and its temperature, min-p and top-k/top-p steps vLLM's ``SamplingStates``
methods) over vLLM's Triton kernels run by the interpreter
(:mod:`tests.kernels.vllm_mrv2`), with vLLM's sort-based top-k/top-p. "With" is
:class:`spectune.vllm._fold_routers.Mrv2FoldRouter` in place of ``_verify``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import MethodType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import vllm._custom_ops  # noqa: F401  (loads vLLM's C++ ops: torch.ops._C)
from vllm.v1.sample import rejection_sampler as rs
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
from vllm.v1.sample.sampler import Sampler as V1Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
from vllm.v1.worker.gpu.sample import sampler as mrv2_sampler
from vllm.v1.worker.gpu.sample import states as mrv2_states
from vllm.v1.worker.gpu.spec_decode import rejection_sampler as mrv2_rs

from spectune.identity import detect_device
from spectune.vllm._configs import TunedConfigs
from spectune.vllm._fold_routers import Mrv2FoldRouter, V1FoldRouter
from spectune.vllm._v1_router import Router
from spectune.vllm.doctor import make_sampling_metadata
from tests.kernels.vllm_mrv2 import load_vllm_mrv2
from tests.vllm.conftest import needs_kernels
from tests.vllm.test_mrv2_route import STATES, K, batch

pytestmark = [
    pytest.mark.vllm,
    needs_kernels,
    pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning"),
]

CPU = torch.device("cpu")


def no_tuned_configs() -> TunedConfigs:
    return TunedConfigs(device=detect_device(), lookup=lambda kernel, problem: None,
                        description="none", usable=0, forced=True)


# --------------------------------------------------------------------------------------
# V1
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _cpu_fallbacks() -> None:
    """vLLM's CPU platform kernels in place of its Triton ones (as the engine has them)."""
    from spectune.vllm._hook import platform_overrides_only

    platform_overrides_only()


@pytest.fixture
def v1_router() -> Iterator[Router]:
    """The V1 verification router with the fold companion, installed and configured."""
    router = Router(rs)
    fold = V1FoldRouter(rs)
    router.add_companion(fold)
    router.fold = fold
    router.install()
    router.route_expand()  # vLLM's own CPU expand garbles per-request values
    router.configure(no_tuned_configs())
    yield router
    router.uninstall()


@contextlib.contextmanager
def vllm_seams(router: Router) -> Iterator[None]:
    """vLLM's own ``apply_sampling_constraints`` and ``rejection_sample`` for a while; the
    CPU expand step stays spectune's (vLLM's garbles per-request top-k on this host)."""
    assert router.fold is not None
    rs.rejection_sample = router.original
    rs.apply_sampling_constraints = router.fold.original
    try:
        yield
    finally:
        router.install()


def v1_batch(vocab: int, seed: int) -> tuple[SpecDecodeMetadata, torch.Tensor]:
    """Four requests (3, 0, 2, 3 drafts), each logits row its own."""
    drafts = [[3, 5, 7], [], [1, 2], [4, 4, 4]]
    metadata = SpecDecodeMetadata.make_dummy(drafts, device=CPU)
    sampled = [len(d) + 1 for d in drafts]
    starts = torch.tensor([0, *sampled]).cumsum(0)[:-1]
    target = torch.cat([torch.arange(s, s + len(d)) for s, d in zip(starts.tolist(), drafts,
                                                                     strict=True)])
    metadata.target_logits_indices = target.to(torch.int32)
    metadata.bonus_logits_indices = (starts + torch.tensor([len(d) for d in drafts])).to(
        torch.int32)
    gen = torch.Generator().manual_seed(seed)
    n = sum(len(d) for d in drafts)
    logits = torch.randn(n + len(drafts), vocab, generator=gen) * 3
    # The drafts are likely tokens: make them so in their rows, so some are accepted.
    for row, token in zip(target.tolist(), [t for d in drafts for t in d], strict=True):
        logits[row, token] += 4.0
    return metadata, logits


def v1_forward(metadata: SpecDecodeMetadata, logits: torch.Tensor, *, top_k: list[int] | None,
               top_p: list[float] | None, logprobs: bool = False) -> list[list[int]]:
    generators = {i: torch.Generator().manual_seed(50 + i) for i in range(4)}
    sampling = make_sampling_metadata([0.8, 1.0, 0.0, 1.3], generators, CPU)
    if top_k is not None:
        sampling.top_k = torch.tensor(top_k, dtype=torch.int32)
    if top_p is not None:
        sampling.top_p = torch.tensor(top_p, dtype=torch.float32)
    if logprobs:
        sampling.max_num_logprobs = 0
    torch.manual_seed(3)
    sampler = rs.RejectionSampler(V1Sampler())
    return sampler(metadata, None, logits.clone(), sampling).sampled_token_ids.tolist()


V1_CASES = {
    "top-k": ([2, 32, 5, 1], None),
    "top-p": (None, [0.3, 0.9, 1.0, 0.5]),
    "top-k-and-top-p": ([3, 8, 32, 6], [0.6, 0.95, 0.5, 1.0]),
    "temperature-only": (None, None),
}


def test_v1_apply_sampling_constraints_has_one_caller_right_before_verification() -> None:
    """What makes deferring V1's step sound: vLLM calls it once, in
    ``RejectionSampler.forward``, and hands its result to ``rejection_sample`` next."""
    import inspect
    import pathlib

    import vllm

    callers = [
        path for path in pathlib.Path(vllm.__file__).parent.rglob("*.py")
        if "apply_sampling_constraints(" in path.read_text(encoding="utf-8").replace(
            "def apply_sampling_constraints(", "")
    ]
    assert [p.name for p in callers] == ["rejection_sampler.py"]
    assert callers[0].parent.name == "sample"
    forward = inspect.getsource(rs.RejectionSampler.forward)
    after = forward.split("target_logits = apply_sampling_constraints(", 1)[1]
    between = after.split("rejection_sample(", 1)[0]
    # Nothing runs between the two calls.
    assert between.split(")", 1)[1].strip() == "output_token_ids ="


@pytest.mark.parametrize("case", list(V1_CASES))
def test_v1_forward_folded_equals_vllm(v1_router: Router, case: str) -> None:
    top_k, top_p = V1_CASES[case]
    for seed in range(3):
        metadata, logits = v1_batch(32, seed)
        with vllm_seams(v1_router):
            without = v1_forward(metadata, logits, top_k=top_k, top_p=top_p)
        folded_before = v1_router.fold.stats.routed  # type: ignore[union-attr]
        with_router = v1_forward(metadata, logits, top_k=top_k, top_p=top_p)
        assert with_router == without, (case, seed)
        assert v1_router.fold.stats.routed == folded_before + 1  # type: ignore[union-attr]


def test_v1_folding_changes_the_tokens_it_should(v1_router: Router) -> None:
    """The comparison can fail: verifying the raw logits (nothing applied) differs."""
    differs = 0
    for seed in range(3):
        metadata, logits = v1_batch(32, seed)
        folded = v1_forward(metadata, logits, top_k=[1, 1, 1, 1], top_p=None)
        with vllm_seams(v1_router):
            plain = rs.RejectionSampler(V1Sampler())
            generators = {i: torch.Generator().manual_seed(50 + i) for i in range(4)}
            sampling = make_sampling_metadata([1.0, 1.0, 0.0, 1.0], generators, CPU)
            torch.manual_seed(3)
            raw = plain(metadata, None, logits.clone(), sampling).sampled_token_ids.tolist()
        differs += folded != raw
    assert differs > 0


def test_v1_logprobs_are_not_folded_and_are_counted(v1_router: Router) -> None:
    metadata, logits = v1_batch(32, 0)
    with vllm_seams(v1_router):
        without = v1_forward(metadata, logits, top_k=[2, 32, 5, 1], top_p=None, logprobs=True)
    with_router = v1_forward(metadata, logits, top_k=[2, 32, 5, 1], top_p=None, logprobs=True)
    fold = v1_router.fold
    assert fold is not None
    assert with_router == without
    assert fold.stats.routed == 0
    assert fold.stats.passed_reasons == {"logprobs requested": 1}
    assert v1_router.stats.routed == 1  # the verification itself is still routed


def test_v1_unrouted_verification_gets_the_parameters_applied(v1_router: Router) -> None:
    """A deferred step whose verification goes to vLLM is applied first, by vLLM."""
    metadata, logits = v1_batch(32, 1)
    with vllm_seams(v1_router):
        without = v1_forward(metadata, logits, top_k=[2, 32, 5, 1], top_p=None)
    v1_router._max_vocab = 16  # the verification kernels "cannot take" this vocabulary
    with_router = v1_forward(metadata, logits, top_k=[2, 32, 5, 1], top_p=None)
    assert with_router == without
    assert v1_router.stats.passed_reasons == {"vocabulary over the kernels' limit": 1}
    assert v1_router.fold is not None and v1_router.fold.stats.routed == 0


# --------------------------------------------------------------------------------------
# Model Runner V2
# --------------------------------------------------------------------------------------

VOCAB = 97


@pytest.fixture(scope="module")
def vllm_kernels() -> Any:
    """vLLM's MRV2 Triton kernels (verification, temperature, min-p), interpreted."""
    return load_vllm_mrv2()


@pytest.fixture
def vllm_steps(monkeypatch: pytest.MonkeyPatch, vllm_kernels: Any) -> None:
    """vLLM's own functions at every name ``_verify`` reaches on this host."""
    monkeypatch.setattr(mrv2_rs, "rejection_sample", vllm_kernels.rejection_sample)
    monkeypatch.setattr(mrv2_states, "apply_temperature", vllm_kernels.gumbel.apply_temperature)
    monkeypatch.setattr(mrv2_states, "apply_min_p", vllm_kernels.min_p.apply_min_p)
    monkeypatch.setattr(mrv2_states, "apply_top_k_top_p", apply_top_k_top_p_pytorch)


@pytest.fixture
def mrv2_router(vllm_steps: None) -> Iterator[Mrv2FoldRouter]:
    router = Mrv2FoldRouter(mrv2_rs.RejectionSampler)
    router.install()
    router.configure(no_tuned_configs())
    yield router
    router.uninstall()


class _Penalties:
    """A logits processor at work (named as vLLM's penalties state, which
    ``_other_processing`` recognises by name): subtracts 1 from token 0."""

    def __init__(self, active: np.ndarray) -> None:
        self.use_penalty = active

    def apply(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        if np.any(self.use_penalty[ctx.idx_mapping_np]):
            logits[:, 0] -= 1.0
        return logits


_Penalties.__name__ = "PenaltiesState"


class _Sampler:
    """What MRV2's ``RejectionSampler`` and ``Sampler.apply_sampling_params`` read of a
    sampler (see the module docstring); that method is vLLM's own."""

    apply_sampling_params = mrv2_sampler.Sampler.apply_sampling_params

    def __init__(self, params: dict[str, list[float]], *, penalties: bool = False) -> None:
        states = SimpleNamespace(vocab_size=VOCAB)
        for name, dtype in (("temperature", np.float32), ("top_k", np.int32),
                            ("top_p", np.float32), ("min_p", np.float32),
                            ("seeds", np.int64)):
            values = np.array(params[name], dtype=dtype)
            states.__dict__[name] = SimpleNamespace(np=values, gpu=torch.from_numpy(values))
        for method in ("apply_temperature", "apply_min_p", "get_top_k_top_p",
                       "apply_top_k_top_p"):
            states.__dict__[method] = MethodType(getattr(mrv2_states.SamplingStates, method),
                                                 states)
        self.sampling_states = states
        # What SamplingStates.add_request says each request needs.
        t, k = states.temperature.np, states.top_k.np
        self.needs_logits_processing = (t != 0) & (
            (t != 1) | (states.min_p.np != 0) | (k != VOCAB) | (states.top_p.np != 1))
        active = np.zeros(STATES, dtype=bool)
        if penalties:
            active[5] = True
            self.needs_logits_processing = self.needs_logits_processing | active
        self.logits_processors = [_Penalties(active)]
        self.thinking_budget_state = SimpleNamespace(enabled=False,
                                                     apply=lambda logits, ctx: None)
        self.use_fp64_gumbel = False
        self.logprobs_mode = "raw_logprobs"
        self.return_sampling_mask = False


MRV2_PARAMS = {
    "temperature": [1.0, 0.0, 0.7, 0.0, 2.0, 1.3],
    "top_k": [VOCAB, VOCAB, 5, VOCAB, VOCAB, 1],
    "top_p": [0.8, 1.0, 0.9, 1.0, 1.0, 0.5],
    "min_p": [0.0, 0.0, 0.05, 0.0, 0.0, 0.1],
    "seeds": [1000 + 7 * i for i in range(STATES)],
}


def mrv2_sampler_of(params: dict[str, list[float]], *, penalties: bool = False) -> Any:
    spec = SimpleNamespace(num_speculative_tokens=K, enable_adaptive_verification=False,
                           rejection_sample_method="standard", synthetic_acceptance_rates=None)
    return mrv2_rs.RejectionSampler(_Sampler(params, penalties=penalties), spec, CPU)  # type: ignore[arg-type]


def mrv2_batch(seed: int, *, draft: bool) -> dict[str, Any]:
    """``_verify``'s arguments (those of the MRV2 routing tests), draft logits or none."""
    args = batch([4, 1, 3, 4], VOCAB, seed=seed)
    if not draft:
        args["draft_logits"] = None
    return args


def mrv2_verify(sampler: Any, args: dict[str, Any]) -> list[list[int]]:
    _, sampled, num_sampled = sampler._verify(**args)
    return [sampled[i, : int(n)].tolist() for i, n in enumerate(num_sampled)]


@pytest.mark.parametrize("draft", [False, True], ids=["no-draft-logits", "draft-logits"])
def test_mrv2_verify_folded_equals_vllm(mrv2_router: Mrv2FoldRouter, draft: bool) -> None:
    sampler = mrv2_sampler_of(MRV2_PARAMS)
    for seed in range(3):
        args = mrv2_batch(seed, draft=draft)
        with_router = mrv2_verify(sampler, args)
        mrv2_router.uninstall()
        try:
            without = mrv2_verify(sampler, args)
        finally:
            mrv2_router.install()
        assert with_router == without, seed
    assert mrv2_router.stats.routed == 3 and mrv2_router.stats.passed == 0


def test_mrv2_folded_returns_the_raw_logits_and_installs_as_a_method(
    mrv2_router: Mrv2FoldRouter,
) -> None:
    assert mrv2_router.installed
    assert mrv2_router.where.endswith("rejection_sampler.RejectionSampler._verify")
    args = mrv2_batch(0, draft=False)
    processed, _, _ = mrv2_sampler_of(MRV2_PARAMS)._verify(**args)
    assert processed is args["logits"]  # never written: what vLLM then does not read
    mrv2_router.uninstall()
    assert not mrv2_router.installed
    assert mrv2_rs.RejectionSampler._verify is mrv2_router.original


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"penalties": True}, "penalties"),
        ({"logprobs_mode": "processed_logprobs"}, "processed logprobs"),
        ({"return_sampling_mask": True}, "sampling mask"),
        ({"plain": True}, None),
    ],
)
def test_mrv2_what_is_not_folded_goes_to_vllm_counted(
    mrv2_router: Mrv2FoldRouter, change: dict[str, Any], reason: str | None
) -> None:
    params = dict(MRV2_PARAMS)
    if change.get("plain"):
        params = {**params, "temperature": [1.0, 0.0, 1.0, 0.0, 1.0, 1.0],
                  "top_k": [VOCAB] * STATES, "top_p": [1.0] * STATES,
                  "min_p": [0.0] * STATES}
    sampler = mrv2_sampler_of(params, penalties=bool(change.get("penalties")))
    for name in ("logprobs_mode", "return_sampling_mask"):
        if name in change:
            setattr(sampler.sampler, name, change[name])
    args = mrv2_batch(1, draft=True)
    with_router = mrv2_verify(sampler, args)
    mrv2_router.uninstall()
    without = mrv2_verify(sampler, args)
    assert with_router == without
    assert mrv2_router.stats.routed == 0
    # A batch without sampling parameters is vLLM's plain verification: not counted.
    assert mrv2_router.stats.passed_reasons == ({reason: 1} if reason else {})
