"""Model Runner V2's verification with and without spectune's routing, on the real vLLM.

The seam is the name ``rejection_sample`` in ``vllm.v1.worker.gpu.spec_decode.
rejection_sampler``, which MRV2's ``RejectionSampler._verify`` calls. The calls here go
through a real ``RejectionSampler`` (its ``_verify``, which applies the sampling
parameters, then verifies). "Without" is vLLM's own MRV2 ``rejection_sample`` and its
Triton kernels, run by Triton's interpreter (on this CPU host vLLM's ``triton`` is a
placeholder, so they are loaded bound to the real Triton: tests/kernels/vllm_mrv2.py);
"with" is :class:`spectune.vllm._mrv2_router.Mrv2Router` in its place.

Two collaborators of ``RejectionSampler`` cannot be built on a host without an
accelerator (vLLM's request and sampling states allocate pinned memory), so its sampler
is a stand-in that does what vLLM's ``Sampler`` does for requests without logits
processing (``apply_sampling_params`` returns the logits unchanged) and holds the
per-request temperature and seed tensors vLLM's sampling states hold. What is claimed,
the routing of ``_verify``'s call, runs entirely in vLLM's and spectune's real code.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from vllm.v1.worker.gpu.spec_decode import rejection_sampler as mrv2_rs

from spectune.db import TunedRow, open_store
from spectune.identity import detect_device, detect_software
from spectune.kernels import get_family
from spectune.space import Problem
from spectune.tuning import compare_with_vllm
from spectune.tuning.trial import wall_time
from spectune.vllm import installed_vllm_version
from spectune.vllm._configs import TunedConfigs
from spectune.vllm._mrv2_router import Mrv2Router
from tests.kernels.vllm_mrv2 import load_vllm_mrv2
from tests.vllm.conftest import needs_kernels, plugin_records

pytestmark = [
    pytest.mark.vllm,
    needs_kernels,
    # numpy's warnings from the interpreter evaluating both sides of a tl.where in vLLM's
    # kernels (log of a negative number, inf - inf where a row is masked).
    pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning"),
]

K = 3
STATES = 6
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def vllm_mrv2() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """vLLM's own MRV2 ``rejection_sample``, its Triton kernels run by the interpreter."""
    return load_vllm_mrv2().rejection_sample


@pytest.fixture
def seam(
    monkeypatch: pytest.MonkeyPatch, vllm_mrv2: Callable[..., Any]
) -> Iterator[None]:
    """vLLM's module with its runnable function at the seam, restored afterwards."""
    monkeypatch.setattr(mrv2_rs, "rejection_sample", vllm_mrv2)
    yield


@pytest.fixture
def router(seam: None) -> Iterator[Mrv2Router]:
    """An installed MRV2 router on this device, nothing tuned: the default configs."""
    router = Mrv2Router(mrv2_rs)
    router.install()
    router.configure(TunedConfigs(device=detect_device(), lookup=lambda kernel, problem: None,
                                  description="none", usable=0, forced=True))
    yield router
    router.uninstall()


class _Sampler:
    """What ``RejectionSampler`` reads of vLLM's MRV2 ``Sampler`` (see module docstring)."""

    def __init__(self, temperature: list[float], seeds: list[int]) -> None:
        self.sampling_states = SimpleNamespace(
            temperature=SimpleNamespace(gpu=torch.tensor(temperature, dtype=torch.float32)),
            seeds=SimpleNamespace(gpu=torch.tensor(seeds, dtype=torch.int64)),
        )
        self.use_fp64_gumbel = False
        self.logprobs_mode = "raw_logprobs"
        self.return_sampling_mask = False

    def apply_sampling_params(self, logits: torch.Tensor, *args: Any) -> torch.Tensor:
        return logits  # no request needs logits processing (vLLM returns them as given)


def rejection_sampler(
    temperature: list[float], *, method: str = "standard", fp64: bool = False
) -> mrv2_rs.RejectionSampler:
    """A real MRV2 ``RejectionSampler`` (k = 3) over the stand-in sampler."""
    spec = SimpleNamespace(
        num_speculative_tokens=K, enable_adaptive_verification=False,
        rejection_sample_method=method,
        synthetic_acceptance_rates=[0.8, 0.6, 0.4] if method == "synthetic" else None,
    )
    sampler = _Sampler(temperature, [1000 + 7 * i for i in range(STATES)])
    sampler.use_fp64_gumbel = fp64
    return mrv2_rs.RejectionSampler(sampler, spec, CPU)  # type: ignore[arg-type]


def batch(
    counts: list[int], vocab: int, *, seed: int, draft_vocab: int | None = None
) -> dict[str, Any]:
    """``_verify``'s arguments: peaked logits, drafts right about half the time."""
    gen = torch.Generator().manual_seed(seed)
    rows = sum(counts)
    logits = torch.randn(rows, vocab, generator=gen) * 2
    top = torch.randint(0, vocab, (rows,), generator=gen)
    logits[torch.arange(rows), top] += 4
    drafts = torch.where(torch.rand(rows, generator=gen) < 0.6, top.roll(1),
                         torch.randint(0, vocab, (rows,), generator=gen))
    cu_np = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    idx_np = np.array([5, 1, 3, 0][: len(counts)], dtype=np.int32)
    idx = torch.from_numpy(idx_np)
    draft_logits = torch.randn(STATES, K, draft_vocab or vocab, generator=gen) * 2
    draft_logits[:, :, :vocab] += logits.mean(0)  # a drafter close to the target
    return {
        "logits": logits,
        "draft_logits": draft_logits,
        "draft_sampled": drafts,
        "pos": torch.arange(50, 50 + rows, dtype=torch.int64),
        "cu_num_logits": torch.from_numpy(cu_np),
        "idx_mapping": idx,
        "idx_mapping_np": idx_np,
        "expanded_idx_mapping": idx.repeat_interleave(torch.tensor(counts)),
        "expanded_local_pos": torch.cat([torch.arange(c) for c in counts]).to(torch.int32),
        "seq_lens_upper_bound_np": np.full(len(counts), 100, dtype=np.int32),
        "verify_draft_sampled": drafts,
    }


def verify(sampler: mrv2_rs.RejectionSampler, args: dict[str, Any], *, draft: bool
           ) -> list[list[int]]:
    """``RejectionSampler._verify`` as ``_verify_in_chunks`` calls it; emitted tokens."""
    call = dict(args)
    if not draft:
        call["draft_logits"] = None
    _, sampled, num_sampled = sampler._verify(**call)
    return [sampled[i, : int(n)].tolist() for i, n in enumerate(num_sampled)]


COUNTS = [4, 1, 3, 4]
TEMPERATURES = [1.0, 0.0, 0.7, 0.0, 2.0, 1.3]  # states 5, 1, 3, 0 in the batch: mixed


@pytest.mark.parametrize("draft", [False, True], ids=["no-draft-logits", "draft-logits"])
@pytest.mark.parametrize("fp64", [False, True], ids=["fp32-gumbel", "fp64-gumbel"])
def test_verify_gives_vllms_tokens_through_the_router(
    router: Mrv2Router, vllm_mrv2: Callable[..., Any], draft: bool, fp64: bool
) -> None:
    sampler = rejection_sampler(TEMPERATURES, fp64=fp64)
    for seed in range(3):
        args = batch(COUNTS, 97, seed=seed)
        with_router = verify(sampler, args, draft=draft)
        mrv2_rs.rejection_sample = vllm_mrv2
        try:
            without = verify(sampler, args, draft=draft)
        finally:
            router.install()
        assert with_router == without, seed
    assert router.stats.routed == 3 and router.stats.passed == 0


@pytest.mark.vllm_kernels
def test_fly_windows_are_routed_with_vllms_tokens(
    router: Mrv2Router, vllm_mrv2: Callable[..., Any]
) -> None:
    """vLLM 0.33's FLy method (in the ``-m vllm_kernels`` session): ``_verify`` passes
    its window, threshold and top-k; the router takes the call, with vLLM's tokens."""
    if load_vllm_mrv2().release == "0.32":
        pytest.skip("vLLM 0.32 has no FLy windows")
    spec = SimpleNamespace(
        num_speculative_tokens=K, enable_adaptive_verification=False,
        rejection_sample_method="fly", synthetic_acceptance_rates=None,
        fly_window_size=1, fly_entropy_threshold=0.0, fly_entropy_top_k=3,
    )
    sampler = mrv2_rs.RejectionSampler(
        _Sampler(TEMPERATURES, [1000 + 7 * i for i in range(STATES)]), spec, CPU,  # type: ignore[arg-type]
    )
    for seed in range(3):
        args = batch(COUNTS, 97, seed=seed)
        with_router = verify(sampler, args, draft=True)
        mrv2_rs.rejection_sample = vllm_mrv2
        try:
            without = verify(sampler, args, draft=True)
        finally:
            router.install()
        assert with_router == without, seed
    assert router.stats.routed == 3 and router.stats.passed == 0


@pytest.mark.parametrize(
    ("method", "reason"),
    [("block", "block verification"), ("synthetic", "synthetic acceptance")],
)
def test_unimplemented_methods_go_to_vllm_and_are_counted(
    router: Mrv2Router, vllm_mrv2: Callable[..., Any], method: str, reason: str
) -> None:
    sampler = rejection_sampler(TEMPERATURES, method=method)
    args = batch(COUNTS, 97, seed=5)
    through_router = verify(sampler, args, draft=True)
    mrv2_rs.rejection_sample = vllm_mrv2
    assert verify(sampler, args, draft=True) == through_router
    assert router.stats.routed == 0
    assert router.stats.passed_reasons == {reason: 1}


def test_narrow_draft_vocabulary_goes_to_vllm(
    router: Mrv2Router, vllm_mrv2: Callable[..., Any]
) -> None:
    """A target vocabulary padded past the drafter's: vLLM's truncation, counted."""
    sampler = rejection_sampler(TEMPERATURES)
    args = batch(COUNTS, 97, seed=6)
    args["draft_logits"] = args["draft_logits"][:, :, :90].contiguous()
    through_router = verify(sampler, args, draft=True)
    mrv2_rs.rejection_sample = vllm_mrv2
    assert verify(sampler, args, draft=True) == through_router
    assert router.stats.passed_reasons == {"draft vocabulary narrower than the target's": 1}
    # A wider draft vocabulary (padding on the drafter's side) is routed.
    router.install()
    wide = batch(COUNTS, 97, seed=6, draft_vocab=101)
    through_router = verify(sampler, wide, draft=True)
    assert router.stats.routed == 1
    mrv2_rs.rejection_sample = vllm_mrv2
    assert verify(sampler, wide, draft=True) == through_router


def test_watermarking_goes_to_vllm(router: Mrv2Router) -> None:
    """Watermarked calls are handed to the function the router replaced, untouched."""
    calls: list[dict[str, Any]] = []

    def replaced(*args: Any, **kwargs: Any) -> str:
        calls.append(kwargs)
        return "vLLM's result"

    router._original = replaced
    args = batch(COUNTS, 97, seed=7)
    key = 0x1234_5678_9ABC
    out = router.rejection_sample(
        args["logits"], None, args["draft_sampled"], args["cu_num_logits"], args["pos"],
        args["idx_mapping"], args["expanded_idx_mapping"], args["expanded_local_pos"],
        torch.ones(STATES), torch.arange(STATES), K,
        contexts=torch.zeros(sum(COUNTS), 2, dtype=torch.int64),
        watermarking=torch.ones(STATES, dtype=torch.bool), watermark_key=key,
    )
    assert out == "vLLM's result" and calls[0]["watermark_key"] == key
    assert router.stats.passed_reasons == {"watermarking": 1} and router.stats.routed == 0


def test_a_failing_routed_call_falls_back_and_never_raises(
    router: Mrv2Router, vllm_mrv2: Callable[..., Any]
) -> None:
    """A launch that fails (here: a config outside the space) gives vLLM's tokens,
    gives vLLM its function back, and says so once."""
    sampler = rejection_sampler(TEMPERATURES)
    args = batch(COUNTS, 97, seed=8)
    key = (K, len(COUNTS) + 1, 97, torch.float32, True)
    router._shape_configs[key] = {"BLOCK_V": 3}  # not in the search space: launch refuses
    with plugin_records() as records:
        tokens = verify(sampler, args, draft=True)
    assert not router.installed and mrv2_rs.rejection_sample is vllm_mrv2
    assert tokens == verify(sampler, args, draft=True)
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"a routed call of {mrv2_rs.__name__}.rejection_sample failed" in warnings[0]


class _HostReads(TorchDispatchMode):
    """Records the aten ops that read a tensor's contents on the host or size an output
    by them (on a GPU: a device synchronisation, a data-dependent allocation)."""

    SYNCING = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "item",
               "equal", "is_nonzero", "repeat_interleave")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.__name__.split(".")[0]
        if name in self.SYNCING:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def test_a_routed_call_reads_no_tensor_contents_on_the_host(router: Mrv2Router) -> None:
    """The router and the launcher size everything by shapes: no ``.item()``, no
    ``nonzero`` (on a GPU each would wait for the device, or size a buffer by data).
    Under the interpreter the kernels themselves only copy tensors."""
    from spectune.kernels import rejection_sample_mrv2

    args = batch(COUNTS, 97, seed=9)
    temperature = torch.tensor(TEMPERATURES, dtype=torch.float32)
    seeds = torch.arange(STATES, dtype=torch.int64)
    call = (args["logits"], args["draft_logits"], args["draft_sampled"],
            args["cu_num_logits"], args["pos"], args["idx_mapping"],
            args["expanded_idx_mapping"], args["expanded_local_pos"], temperature, seeds, K)
    recorder = _HostReads()
    with recorder:
        sampled, num_sampled = router.rejection_sample(*call)
    assert router.stats.routed == 1
    assert recorder.seen == [], recorder.seen
    assert sampled.shape == (len(COUNTS), K + 1) and num_sampled.shape == (len(COUNTS),)
    # The same recorder sees the contents checks a direct caller gets with validate=True.
    with recorder:
        rejection_sample_mrv2(*call, validate=True)
    assert "_local_scalar_dense" in recorder.seen


# Launch configs of the MRV2 family that are, under the interpreter, far from vLLM's own
# MRV2 kernels either way: the whole vocabulary in one 16384-logit block per program
# runs in about 0.6x vLLM's time at k = 3, B = 1, V = 16384 (measured here: 228 vs 405 ms);
# 256-logit tiles with 16 splits several times slower than vLLM's at V = 300.
FAST = {"BLOCK_V": 16384, "BLOCK_R": 16384, "SPLITS": 1, "num_warps": 1, "num_stages": 4}
SLOW = {"BLOCK_V": 256, "BLOCK_R": 256, "SPLITS": 16, "num_warps": 1, "num_stages": 2}


@needs_kernels
def test_routed_where_measured_faster_than_vllm_passed_where_slower(
    seam: None, vllm_mrv2: Callable[..., Any], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The verdicts measured against vLLM's own MRV2 kernels (side by side, tokens
    checked) decide, on a real ``RejectionSampler``: the fast config's shape is routed,
    the slow config's goes to vLLM, counted; the tokens are vLLM's either way."""
    family = get_family("rejection_sample_mrv2")
    device, software = detect_device(), detect_software()
    shapes = {"fast": ([4], 16384, FAST), "slow": ([2, 4], 300, SLOW)}
    rows = []
    for name, (counts, vocab, config) in shapes.items():
        problem = Problem(spec_len=K, batch=len(counts), vocab=vocab, draft_probs=True)
        measured = compare_with_vllm(family=family, inputs=family.make_inputs(problem, seed=1),
                                     config=config, timer=functools.partial(wall_time, repeats=3))
        expected = "faster" if name == "fast" else "not faster"
        assert measured.comparison.verdict == expected, (name, measured)
        assert measured.comparison.version == installed_vllm_version()
        rows.append(TunedRow(
            device=device, software=software, kernel=family.name,
            kernel_hash=family.source_hash, problem=problem, config=config,
            tuned=measured.ours, default=measured.ours, trials=1, tuning_seconds=1.0,
            host="test", study="test", vllm=measured.comparison,
        ))
    db = tmp_path / "tuned.db"
    with open_store(db) as store:
        store.record_many(rows)
    monkeypatch.setenv("SPECTUNE_DB", str(db))
    monkeypatch.setenv("SPECTUNE_USER_DB", str(tmp_path / "absent" / "user.db"))
    monkeypatch.delenv("SPECTUNE_FORCE", raising=False)
    router = Mrv2Router(mrv2_rs)
    router.install()
    try:
        configs = TunedConfigs.load(families=[family.name])
        assert (configs.usable, configs.faster) == (2, 1)
        router.configure(configs)
        sampler = rejection_sampler(TEMPERATURES)
        for counts, vocab, _ in shapes.values():
            args = batch(counts, vocab, seed=3)
            with_router = verify(sampler, args, draft=True)
            mrv2_rs.rejection_sample = vllm_mrv2
            try:
                without = verify(sampler, args, draft=True)
            finally:
                router.install()
            assert with_router == without
        assert router.stats.routed == 1
        assert router.stats.passed_reasons == {"vllm faster here": 1}
    finally:
        router.uninstall()
