"""``spectune.kernels.rejection_sample_mrv2``: configs, random numbers, validation, edges,
family.

What vLLM's tokens are is
:mod:`tests.kernels.rejection_mrv2.test_rejection_mrv2_vs_vllm`'s business; here the
kernels are held to their own promises: every config of the declared space gives the
same tokens, the host reproductions of the random streams are the kernels' numbers,
every bad argument is refused by name, degenerate batches work, and the family adapter
the tuner uses is consistent.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

from spectune.identity import backend_of
from spectune.kernels import MAX_VOCAB, get_family, rejection_sample_mrv2

# White-box: vLLM's counter-based random streams, in-kernel and their host copies.
from spectune.kernels._counter_rng import COIN_FLOOR, MURMUR_HIGH_DOMAIN
from spectune.kernels._counter_rng import coin as _coin
from spectune.kernels._counter_rng import gumbel_noise as _gumbel_noise
from spectune.kernels._counter_rng import murmur_noise_bits as _murmur_noise_bits
from spectune.kernels._counter_rng_host import _murmur, coins, gumbel_noise
from spectune.kernels.rejection_mrv2 import (
    Mrv2Inputs,
    Mrv2Reference,
    mrv2_results_agree,
    rejection_sample_mrv2_reference,
    unfolded_mrv2,
)

# White-box: the softmax group every statistics tile must hold whole.
from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_constants import GROUP
from spectune.space import InvalidConfigError, Problem
from tests.kernels.conftest import DEVICE
from tests.kernels.mrv2_cases import (
    FlyCase,
    Mrv2Case,
    build_fly,
    build_mrv2,
    fly_greedy_batch,
    output_lists,
)

FAMILY = get_family("rejection_sample_mrv2")

pytestmark = pytest.mark.filterwarnings(
    # numpy's warnings from the interpreter evaluating both sides of a tl.where.
    "ignore:.*encountered in:RuntimeWarning"
)

BACKEND = backend_of(DEVICE)
_F32, _BF16, _F16 = torch.float32, torch.bfloat16, torch.float16


def on_device(inputs: Mrv2Inputs) -> Mrv2Inputs:
    moved = {
        name: value.to(DEVICE) if isinstance(value, torch.Tensor) else value
        for name, value in vars(inputs).items()
    }
    return Mrv2Inputs(**moved)


def run(inputs: Mrv2Inputs, config: dict[str, int] | None = None) -> tuple[torch.Tensor, ...]:
    sampled, num_sampled = rejection_sample_mrv2(*inputs.args(), config=config)
    return sampled.cpu(), num_sampled.cpu()


def reference(inputs: Mrv2Inputs) -> Mrv2Reference:
    return rejection_sample_mrv2_reference(*inputs.args())


def assert_matches_reference(inputs: Mrv2Inputs, out: tuple[torch.Tensor, ...]) -> None:
    ok, why = mrv2_results_agree(reference(inputs), (out[0], out[1]))
    assert ok, why


# --------------------------------------------------------------------------------------
# (a) Every config of the space: the same tokens
# --------------------------------------------------------------------------------------

_SPACE = FAMILY.search_space(BACKEND)
_TILE_PARAMS = ("BLOCK_V", "BLOCK_R", "SPLITS")


def sample_configs(count: int, seed: int) -> list[dict[str, int]]:
    """``count`` valid configs of the space: the corners of (BLOCK_V, BLOCK_R, SPLITS),
    every value of every parameter at least once, then random ones (fixed ``seed``)."""
    everything = list(_SPACE)
    rng = random.Random(seed)
    chosen: list[dict[str, int]] = []

    def pick(**fixed: int) -> None:
        matching = [c for c in everything if all(c[k] == v for k, v in fixed.items())]
        matching = [c for c in matching if c not in chosen]
        if matching:
            chosen.append(rng.choice(matching))

    lows = {name: _SPACE.param(name).values[0] for name in _TILE_PARAMS}
    highs = {name: _SPACE.param(name).values[-1] for name in _TILE_PARAMS}
    for corner in range(2 ** len(_TILE_PARAMS)):
        pick(**{name: (highs if corner >> i & 1 else lows)[name]
                for i, name in enumerate(_TILE_PARAMS)})
    for param in _SPACE.params:
        for value in param.values:
            if not any(c[param.name] == value for c in chosen):
                pick(**{param.name: value})
    while len(chosen) < count:
        pick()
    return chosen


CONFIGS = sample_configs(24, seed=2024)
CONFIG_CASES = [
    # Vocabulary not a multiple of 256 (the softmax group): a partial last group.
    Mrv2Case(4, 3, 1000, _F32, True, "mixed", placeholders=0.2, seed=50),
    # 17 tiles of 256: SPLITS 32 and 64 exceed the tile count; float64 Gumbel.
    Mrv2Case(3, 2, 4099, _BF16, False, "random", use_fp64=True, seed=51),
    # One tile whatever the config: every SPLITS > 1 exceeds it.
    Mrv2Case(3, 4, 97, _F16, True, "mixed", feature="masked", placeholders=0.1, seed=52),
]


def _config_id(config: dict[str, int]) -> str:
    return "-".join(f"{k.replace('num_', '')}{v}" for k, v in config.items())


def test_sampled_configs_cover_the_space() -> None:
    assert len(CONFIGS) == 24
    assert all(_SPACE.is_valid(c) for c in CONFIGS)
    for param in _SPACE.params:
        assert {c[param.name] for c in CONFIGS} == set(param.values), param.name
    corners = {tuple(c[n] for n in _TILE_PARAMS) for c in CONFIGS}
    assert (256, 256, 64) in corners and (16384, 16384, 1) in corners
    # The space as the launcher sees it on this backend is the declared one.
    assert _SPACE.names == tuple(p.name for p in FAMILY.space.SEARCH_SPACE.params
                                 if p.applies_to(BACKEND))


def test_every_statistics_tile_holds_whole_softmax_groups() -> None:
    """The kernels sum the softmax in groups of GROUP logits, exact whatever the config:
    every statistics tile (``BLOCK_V``) the space declares is a multiple of it."""
    tiles = FAMILY.space.SEARCH_SPACE.param("BLOCK_V").values
    assert all(tile % GROUP.value == 0 for tile in tiles), (tiles, GROUP.value)


_BASELINES: dict[Mrv2Case, tuple[torch.Tensor, ...]] = {}


def baseline(case: Mrv2Case) -> tuple[Mrv2Inputs, tuple[torch.Tensor, ...]]:
    """The case's inputs and the default config's output (checked against the reference)."""
    inputs = on_device(build_mrv2(case))
    if case not in _BASELINES:
        out = run(inputs)
        assert_matches_reference(inputs, out)
        _BASELINES[case] = out
    return inputs, _BASELINES[case]


@pytest.mark.parametrize("config", CONFIGS, ids=_config_id)
@pytest.mark.parametrize("case", CONFIG_CASES, ids=lambda c: c.id)
def test_every_config_gives_the_same_tokens(case: Mrv2Case, config: dict[str, int]) -> None:
    inputs, (want_sampled, want_counts) = baseline(case)
    sampled, counts = run(inputs, config)
    assert torch.equal(counts, want_counts), (counts.tolist(), want_counts.tolist())
    assert torch.equal(sampled, want_sampled), (sampled.tolist(), want_sampled.tolist())


# --------------------------------------------------------------------------------------
# (b) The host random numbers are the kernels'
# --------------------------------------------------------------------------------------

_SEEDS = [0, 1, -1, 12345, -(2**63), 2**63 - 1, 0x1234_5678_9ABC_DEF0, -(2**40) - 7]
_POSITIONS = torch.cat([
    torch.tensor([0, 1, 2, 1000, 2**31 - 1, 2**31, 2**32 - 1, 2**32 + 7, 2**40 + 5, 2**62]),
    torch.randint(0, 2**31, (500,), generator=torch.Generator().manual_seed(5)),
]).to(torch.int64)


@triton.jit
def _tl_rand_kernel(seed_ptr, pos_ptr, out_ptr, coin_ptr, n, BLOCK: tl.constexpr):
    seed = tl.load(seed_ptr + tl.program_id(0))
    offs = tl.arange(0, BLOCK)
    pos = tl.load(pos_ptr + offs, mask=offs < n, other=0)
    row = tl.program_id(0) * n + offs
    tl.store(out_ptr + row, tl.rand(seed, pos), mask=offs < n)
    tl.store(coin_ptr + row, _coin(seed, pos), mask=offs < n)


def test_coins_are_tl_rand_bit_for_bit() -> None:
    """``coins`` is ``max(tl.rand(seed, pos), COIN_FLOOR)`` bitwise, and so is the kernels'
    ``_coin``: seeds over all of int64 (loaded as int64, as the kernels do), positions
    past 2**32 included."""
    seeds = torch.tensor(_SEEDS, dtype=torch.int64)
    n = _POSITIONS.numel()
    raw = torch.empty(len(_SEEDS), n, dtype=torch.float32, device=DEVICE)
    floored = torch.empty_like(raw)
    _tl_rand_kernel[(len(_SEEDS),)](
        seeds.to(DEVICE), _POSITIONS.to(DEVICE), raw, floored, n,
        BLOCK=triton.next_power_of_2(n),
    )
    raw, floored = raw.cpu(), floored.cpu()
    for i, seed in enumerate(_SEEDS):
        host = coins(seed, _POSITIONS)
        assert host.dtype == torch.float32
        assert torch.equal(torch.clamp(raw[i], min=COIN_FLOOR.value), host), seed
        assert torch.equal(floored[i], host), seed
    # Distinct streams: the seed and both words of the position matter.
    assert not torch.equal(raw[0], raw[1])
    assert float(coins(7, torch.tensor([2**32 + 3]))) != float(coins(7, torch.tensor([3])))


@triton.jit
def _noise_kernel(tok_ptr, bits_ptr, high_ptr, noise32_ptr, noise64_ptr, seed, pos,
                  BLOCK: tl.constexpr, HIGH: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tokens = tl.load(tok_ptr + offs)
    tl.store(bits_ptr + offs, _murmur_noise_bits(seed, pos, tokens, 0).to(tl.int64))
    tl.store(high_ptr + offs, _murmur_noise_bits(seed, pos, tokens, HIGH).to(tl.int64))
    tl.store(noise32_ptr + offs, _gumbel_noise(seed, pos, tokens, False))
    tl.store(noise64_ptr + offs, _gumbel_noise(seed, pos, tokens, True))


_NOISE_TOKENS = torch.cat([
    torch.arange(64),
    torch.tensor([151935, 128255, 31999, MAX_VOCAB - 1]),
    torch.randint(0, MAX_VOCAB, (188,), generator=torch.Generator().manual_seed(6)),
]).to(torch.int64)


def _within_ulps(kernel: torch.Tensor, host: torch.Tensor, ulps: int) -> torch.Tensor:
    eps = torch.finfo(host.dtype).eps
    return (kernel - host).abs() <= ulps * eps * (1.0 + host.abs())


@pytest.mark.parametrize(
    ("seed", "pos"),
    [(0, 0), (12345, 1000), (-(2**63), 2**31 - 1), (2**63 - 1, 2**40 + 5), (-77, 4096)],
)
def test_gumbel_noise_is_the_kernels(seed: int, pos: int) -> None:
    """The MurmurHash3 words are bitwise the kernels'; the noise is theirs up to the
    last-ulp difference of torch's ``log`` and the backend's (the module's documented
    contract, inside the reference's near-tie margin)."""
    n = _NOISE_TOKENS.numel()
    outs = [torch.empty(n, dtype=dt, device=DEVICE)
            for dt in (torch.int64, torch.int64, torch.float32, torch.float64)]
    _noise_kernel[(1,)](_NOISE_TOKENS.to(DEVICE), *outs, seed, pos, BLOCK=n,
                        HIGH=MURMUR_HIGH_DOMAIN.value)
    bits, high, noise32, noise64 = (t.cpu() for t in outs)
    assert torch.equal(bits & 0xFFFFFFFF, _murmur(seed, pos, _NOISE_TOKENS, 0))
    assert torch.equal(high & 0xFFFFFFFF,
                       _murmur(seed, pos, _NOISE_TOKENS, MURMUR_HIGH_DOMAIN.value))
    host32 = gumbel_noise(seed, pos, _NOISE_TOKENS, fp64=False)
    host64 = gumbel_noise(seed, pos, _NOISE_TOKENS, fp64=True)
    assert host32.dtype == torch.float32 and host64.dtype == torch.float64
    assert bool(_within_ulps(noise32, host32, 4).all()), (noise32 - host32).abs().max()
    assert bool(_within_ulps(noise64, host64, 4).all()), (noise64 - host64).abs().max()
    # Gumbel(0, 1) and distinct per token: not a constant, not the same stream twice.
    assert len(set(host32.tolist())) > n - 2 and -3.0 < float(host64.mean()) < 3.0
    assert not torch.equal(host32, gumbel_noise(seed, pos + 1, _NOISE_TOKENS, fp64=False))


def _vllm_gumbel() -> Any:
    """vLLM's ``gumbel`` module with real Triton kernels; skip (fail in CI) without vllm."""
    try:
        import vllm.triton_utils  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name != "vllm" or os.environ.get("CI"):
            raise
        pytest.skip("vllm is not installed")
    from tests.kernels.vllm_mrv2 import load_vllm_mrv2

    return load_vllm_mrv2().gumbel


#: vLLM's fresh ``gumbel`` module, set by :func:`test_noise_and_coins_are_vllms` before it
#: launches :func:`_vllm_noise_kernel` (a kernel resolves names in its module's globals).
vllm_gumbel: Any = None


@triton.jit
def _vllm_noise_kernel(tok_ptr, noise_ptr, bits_ptr, coin_ptr, seed, pos, BLOCK: tl.constexpr,
                       FP64: tl.constexpr):
    """vLLM's noise of one token per program, read out of its own Gumbel-max: logits 0
    and only that token unmasked, so the max is ``0 + noise`` exactly."""
    i = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    tokens = tl.load(tok_ptr + offs)
    value, _ = vllm_gumbel.gumbel_noised_argmax(
        tl.zeros((BLOCK,), tl.float32), tokens, offs == i, seed, pos, 1.0,
        IS_DRAFTING=False, USE_FP64=FP64, APPLY_TEMPERATURE=False,
    )
    tl.store(noise_ptr + i, value)
    if i == 0:
        tl.store(bits_ptr + offs, vllm_gumbel.murmur3_hash32(seed, pos, tokens).to(tl.int64))
        tl.store(coin_ptr, vllm_gumbel.tl_rand32(seed, pos, False))


@pytest.mark.vllm
@pytest.mark.parametrize("fp64", [False, True], ids=["fp32", "fp64"])
@pytest.mark.parametrize(("seed", "pos"), [(987654321, 1000), (-(2**62) - 5, 2**32 + 9)])
def test_noise_and_coins_are_vllms(seed: int, pos: int, fp64: bool) -> None:
    """vLLM's own ``gumbel_noised_argmax`` draws our kernels' noise bit for bit, its
    ``murmur3_hash32`` is the host's hash and its ``tl_rand32`` the host's coin."""
    global vllm_gumbel
    vllm_gumbel = _vllm_gumbel()
    tokens = torch.cat([torch.arange(8), _NOISE_TOKENS[-8:]]).to(DEVICE)
    n = tokens.numel()
    dtype = torch.float64 if fp64 else torch.float32
    theirs = torch.empty(n, dtype=dtype, device=DEVICE)
    bits = torch.empty(n, dtype=torch.int64, device=DEVICE)
    coin = torch.empty(1, dtype=torch.float32, device=DEVICE)
    _vllm_noise_kernel[(n,)](tokens, theirs, bits, coin, seed, pos, BLOCK=n, FP64=fp64)
    outs = [torch.empty(n, dtype=dt, device=DEVICE)
            for dt in (torch.int64, torch.int64, torch.float32, torch.float64)]
    _noise_kernel[(1,)](tokens, *outs, seed, pos, BLOCK=n, HIGH=MURMUR_HIGH_DOMAIN.value)
    ours = outs[3 if fp64 else 2].cpu()
    assert torch.equal(theirs.cpu(), ours), (theirs.cpu() - ours).abs().max()
    assert torch.equal(bits.cpu() & 0xFFFFFFFF, _murmur(seed, pos, tokens.cpu(), 0))
    assert torch.equal(coin.cpu(), coins(seed, torch.tensor([pos])))


# --------------------------------------------------------------------------------------
# (c) Validation: every bad argument refused by name
# --------------------------------------------------------------------------------------

_VALID = Mrv2Case(3, 2, 7, _F32, True, "mixed", spare_states=2, seed=71)


def _valid_inputs() -> Mrv2Inputs:
    inputs = build_mrv2(_VALID)
    counts = torch.diff(inputs.cu_num_logits.long()) - 1
    assert counts.tolist() == [2, 0, 2], counts  # what the mutations below assume
    return on_device(inputs)


def _swap_rows(t: torch.Tensor, a: int, b: int) -> torch.Tensor:
    t = t.clone()
    t[[a, b]] = t[[b, a]]
    return t


def _set(t: torch.Tensor, index: int, value: float) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


def _transposed(t: torch.Tensor) -> torch.Tensor:
    """Same shape and values, last dimension not contiguous."""
    out = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert out.stride(-1) != 1 or t.shape[-1] == 1
    return out


def _default(inputs: Mrv2Inputs) -> dict[str, int]:
    """The default config of ``inputs``' problem."""
    return FAMILY.default_config(FAMILY.problem_of(inputs), BACKEND)


# (argument the message must name, change to valid inputs: fields or "config" -> value)
Mutation = Callable[[Mrv2Inputs], dict[str, Any]]
BAD_ARGUMENTS: list[tuple[str, str, Mutation]] = [
    ("target-float64", "target_logits", lambda i: {"target_logits": i.target_logits.double()}),
    ("target-int", "target_logits", lambda i: {"target_logits": i.target_logits.long()}),
    ("target-1d", "target_logits", lambda i: {"target_logits": i.target_logits[0]}),
    ("target-list", "target_logits", lambda i: {"target_logits": i.target_logits.tolist()}),
    ("target-last-dim-strided", "target_logits",
     lambda i: {"target_logits": _transposed(i.target_logits)}),
    ("target-vocab-0", "target_logits", lambda i: {"target_logits": i.target_logits[:, :0]}),
    ("target-vocab-too-big", "target_logits", lambda i: {
        "target_logits": torch.empty(i.target_logits.shape[0], MAX_VOCAB + 1,
                                     dtype=torch.bfloat16, device=DEVICE)}),
    ("draft-int", "draft_logits", lambda i: {"draft_logits": i.draft_logits.int()}),
    ("draft-2d", "draft_logits", lambda i: {"draft_logits": i.draft_logits[0]}),
    ("draft-last-dim-strided", "draft_logits",
     lambda i: {"draft_logits": _transposed(i.draft_logits)}),
    ("draft-vocab-narrower", "draft_logits",
     lambda i: {"draft_logits": i.draft_logits[..., :-1].contiguous()}),
    ("draft-fewer-steps", "draft_logits",
     lambda i: {"draft_logits": i.draft_logits[:, :1].contiguous()}),
    ("drafts-float", "draft_sampled", lambda i: {"draft_sampled": i.draft_sampled.float()}),
    ("drafts-int16", "draft_sampled", lambda i: {"draft_sampled": i.draft_sampled.short()}),
    ("drafts-short", "draft_sampled", lambda i: {"draft_sampled": i.draft_sampled[:-1]}),
    ("drafts-below-minus-1", "draft_sampled",
     lambda i: {"draft_sampled": _set(i.draft_sampled, 1, -2)}),
    ("drafts-vocab", "draft_sampled",
     lambda i: {"draft_sampled": _set(i.draft_sampled, 2, _VALID.vocab)}),
    ("drafts-strided", "draft_sampled",
     lambda i: {"draft_sampled": i.draft_sampled.repeat_interleave(2)[::2]}),
    ("pos-float", "pos", lambda i: {"pos": i.pos.float()}),
    ("pos-2d", "pos", lambda i: {"pos": i.pos[None]}),
    ("pos-negative", "pos", lambda i: {"pos": _set(i.pos, 3, -1)}),
    ("cu-float", "cu_num_logits", lambda i: {"cu_num_logits": i.cu_num_logits.float()}),
    ("cu-2d", "cu_num_logits", lambda i: {"cu_num_logits": i.cu_num_logits[None]}),
    ("cu-empty", "cu_num_logits", lambda i: {"cu_num_logits": i.cu_num_logits[:0]}),
    ("cu-not-from-0", "cu_num_logits", lambda i: {"cu_num_logits": i.cu_num_logits + 1}),
    ("cu-request-without-rows", "cu_num_logits",
     lambda i: {"cu_num_logits": _set(i.cu_num_logits, 2, int(i.cu_num_logits[1]))}),
    ("cu-end-not-rows", "cu_num_logits",
     lambda i: {"cu_num_logits": _set(i.cu_num_logits, 3, int(i.cu_num_logits[3]) - 1)}),
    ("more-drafts-than-k", "cu_num_logits", lambda i: {"num_speculative_steps": 1}),
    ("k-negative", "num_speculative_steps", lambda i: {"num_speculative_steps": -1}),
    ("k-bool", "num_speculative_steps", lambda i: {"num_speculative_steps": True}),
    ("k-float", "num_speculative_steps", lambda i: {"num_speculative_steps": 2.0}),
    ("idx-float", "idx_mapping", lambda i: {"idx_mapping": i.idx_mapping.float()}),
    ("idx-short", "idx_mapping", lambda i: {"idx_mapping": i.idx_mapping[:-1]}),
    ("idx-past-states", "idx_mapping",
     lambda i: {"idx_mapping": _set(i.idx_mapping, 1, i.temperature.shape[0])}),
    ("idx-negative", "idx_mapping", lambda i: {"idx_mapping": _set(i.idx_mapping, 0, -1)}),
    ("idx-past-draft-states", "idx_mapping", lambda i: {
        "draft_logits": i.draft_logits[: int(i.idx_mapping.max())].contiguous()}),
    ("expanded-idx-swapped", "expanded_idx_mapping",
     lambda i: {"expanded_idx_mapping": _swap_rows(i.expanded_idx_mapping, 0, 3)}),
    ("expanded-idx-short", "expanded_idx_mapping",
     lambda i: {"expanded_idx_mapping": i.expanded_idx_mapping[1:]}),
    ("local-pos-off", "expanded_local_pos",
     lambda i: {"expanded_local_pos": _set(i.expanded_local_pos, 2, 5)}),
    ("local-pos-float", "expanded_local_pos",
     lambda i: {"expanded_local_pos": i.expanded_local_pos.float()}),
    ("temperature-float64", "temperature", lambda i: {"temperature": i.temperature.double()}),
    ("temperature-negative", "temperature",
     lambda i: {"temperature": _set(i.temperature, int(i.idx_mapping[2]), -0.5)}),
    ("temperature-nan", "temperature",
     lambda i: {"temperature": _set(i.temperature, 0, float("nan"))}),
    ("temperature-inf", "temperature",
     lambda i: {"temperature": _set(i.temperature, 0, float("inf"))}),
    ("seed-int32", "seed", lambda i: {"seed": i.seed.int()}),
    ("seed-short", "seed", lambda i: {"seed": i.seed[:-1]}),
    ("use-fp64-int", "use_fp64", lambda i: {"use_fp64": 1}),
    ("config-block-not-power-of-2", "BLOCK_V",
     lambda i: {"config": {**_default(i), "BLOCK_V": 300}}),
    ("config-splits-undeclared", "SPLITS",
     lambda i: {"config": {**_default(i), "SPLITS": 128}}),
    ("config-unknown-key", "BLOCK_Q",
     lambda i: {"config": {**_default(i), "BLOCK_Q": 1}}),
    ("config-missing-key", "num_stages", lambda i: {"config": {
        k: v for k, v in _default(i).items()
        if k != "num_stages"}}),
    ("config-constraint", "num_warps", lambda i: {"config": {
        **_default(i), "BLOCK_R": 256, "num_warps": 8}}),
    ("config-bool", "num_warps", lambda i: {
        "config": {**_default(i), "num_warps": True}}),
]


def test_valid_inputs_are_accepted() -> None:
    """The base of every mutation below runs (so each error is the mutation's)."""
    inputs = _valid_inputs()
    out = run(inputs)
    assert_matches_reference(inputs, out)
    for config in (None, CONFIGS[0]):
        rejection_sample_mrv2(*inputs.args(), config=config)


@pytest.mark.parametrize(("name", "mutate"), [(n, m) for _, n, m in BAD_ARGUMENTS],
                         ids=[i for i, _, _ in BAD_ARGUMENTS])
def test_bad_argument_is_refused_by_name(name: str, mutate: Mutation) -> None:
    inputs = _valid_inputs()
    change = mutate(inputs)
    config = change.pop("config", None)
    bad = replace(inputs, **change)
    with pytest.raises(ValueError, match=rf"\b{name}\b") as info:
        rejection_sample_mrv2(*bad.args(), config=config)
    if config is not None:
        assert isinstance(info.value, InvalidConfigError)


def test_validate_false_skips_only_the_content_checks() -> None:
    """``validate=False`` (the router's path) still checks shapes and dtypes."""
    inputs = _valid_inputs()
    with pytest.raises(ValueError, match="seed"):
        rejection_sample_mrv2(*replace(inputs, seed=inputs.seed.int()).args(), validate=False)
    assert run(inputs)[0].tolist() == rejection_sample_mrv2(
        *inputs.args(), validate=False)[0].cpu().tolist()


# --------------------------------------------------------------------------------------
# (d) Degenerate batches
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("with_draft", [True, False], ids=["dl", "nodl"])
def test_no_requests(k: int, with_draft: bool) -> None:
    vocab = 13
    inputs = on_device(Mrv2Inputs(
        target_logits=torch.empty(0, vocab),
        draft_logits=torch.empty(2, k, vocab) if with_draft else None,
        draft_sampled=torch.empty(0, dtype=torch.int64),
        cu_num_logits=torch.zeros(1, dtype=torch.int32),
        pos=torch.empty(0, dtype=torch.int64),
        idx_mapping=torch.empty(0, dtype=torch.int32),
        expanded_idx_mapping=torch.empty(0, dtype=torch.int32),
        expanded_local_pos=torch.empty(0, dtype=torch.int32),
        temperature=torch.ones(2),
        seed=torch.zeros(2, dtype=torch.int64),
        num_speculative_steps=k,
    ))
    sampled, counts = run(inputs)
    assert sampled.shape == (0, k + 1) and sampled.dtype == torch.int64
    assert counts.shape == (0,) and counts.dtype == torch.int32
    ref = reference(inputs)
    assert ref.sampled.shape == (0, k + 1)


def _greedy_expected(inputs: Mrv2Inputs, req: int) -> list[int]:
    """A greedy request's tokens: the target argmax along its drafts, first index on ties."""
    cu = inputs.cu_num_logits.tolist()
    logits = inputs.target_logits.float().cpu()
    drafts = inputs.draft_sampled.tolist()
    tokens = []
    for row in range(cu[req], cu[req + 1]):
        tokens.append(int(logits[row].argmax()))
        if row == cu[req + 1] - 1 or drafts[row + 1] != tokens[-1]:
            break
    return tokens


@pytest.mark.parametrize(
    "case",
    [
        Mrv2Case(5, 0, 97, _F32, True, "mixed", seed=70),
        Mrv2Case(4, 0, 1000, _BF16, False, "random", use_fp64=True, seed=71),
        Mrv2Case(6, 4, 97, _F16, True, "mixed", placeholders=1.0, seed=72),
        Mrv2Case(4, 3, 7, _F32, False, "random", placeholders=1.0, use_fp64=True, seed=73),
        Mrv2Case(7, 5, 257, _F32, True, "mixed", spare_states=1, seed=74),
        Mrv2Case(3, 2, 1, _F32, True, "mixed", placeholders=0.5, seed=75),
    ],
    ids=lambda c: c.id,
)
def test_degenerate_batches(case: Mrv2Case) -> None:
    """``k = 0`` (bonus rows only), every draft a placeholder, requests without drafts:
    one token per request where nothing can be accepted; greedy tokens are the argmax."""
    inputs = on_device(build_mrv2(case))
    out = run(inputs)
    assert_matches_reference(inputs, out)
    lists = output_lists(*out)
    temps = inputs.temperature[inputs.idx_mapping.long()].cpu()
    n_drafts = (torch.diff(inputs.cu_num_logits.long()) - 1).cpu()
    assert int((n_drafts == 0).sum()) > 0
    for req, tokens in enumerate(lists):
        if case.k == 0 or case.placeholders == 1.0 or n_drafts[req] == 0:
            assert len(tokens) == 1, (req, tokens)
        if float(temps[req]) == 0.0:
            assert tokens == _greedy_expected(inputs, req), req
        assert all(0 <= t < case.vocab for t in tokens)
    if case.vocab == 1:
        assert all(set(t) == {0} for t in lists)


# --------------------------------------------------------------------------------------
# (e) The family adapter
# --------------------------------------------------------------------------------------

FAMILY_PROBLEMS = [
    Problem(spec_len=1, batch=1, vocab=1, dtype="float32", draft_probs=True),
    Problem(spec_len=3, batch=5, vocab=1000, dtype="bfloat16", draft_probs=True),
    Problem(spec_len=2, batch=3, vocab=4099, dtype="float16", draft_probs=False),
    Problem(spec_len=8, batch=2, vocab=97, dtype="float32", draft_probs=False),
    Problem(spec_len=5, batch=7, vocab=257, dtype="bfloat16", draft_probs=False),
]


def _problem_id(p: Problem) -> str:
    return f"k{p.spec_len}-B{p.batch}-V{p.vocab}-{p.dtype}-{'dp' if p.draft_probs else 'nodp'}"


def test_family_is_registered() -> None:
    assert get_family("rejection_sample_mrv2") is FAMILY
    assert FAMILY.name == "rejection_sample_mrv2"
    assert list(FAMILY.search_space(BACKEND)) == list(_SPACE)
    # The inputs' positional order is the launcher's (and vLLM's).
    params = list(inspect.signature(rejection_sample_mrv2).parameters)
    fields = [f.name for f in dataclasses.fields(Mrv2Inputs)]
    assert params[:12] == fields[:12]
    # The rest are the launcher's keyword-only folding arguments (Mrv2Inputs.kwargs()).
    assert fields[12:] == list(Mrv2Inputs(*[None] * 11).kwargs())
    assert set(fields[12:]) <= set(params[12:])


@pytest.mark.parametrize("problem", FAMILY_PROBLEMS, ids=_problem_id)
def test_family_round_trip(problem: Problem) -> None:
    """make_inputs -> problem_of round-trips; the default config's launch is the
    reference's tokens (``same``); ``same`` sees one token or one count changed where no
    near-tie excuses it."""
    inputs = FAMILY.make_inputs(problem, seed=problem.vocab, device=DEVICE)
    assert FAMILY.problem_of(inputs) == problem
    assert (inputs.draft_logits is not None) == problem.draft_probs
    assert inputs.target_logits.dtype == getattr(torch, problem.dtype)
    assert inputs.target_logits.shape == ((problem.spec_len + 1) * problem.batch, problem.vocab)
    config = FAMILY.default_config(problem, BACKEND)
    assert config == FAMILY.default_config(problem, BACKEND) and _SPACE.is_valid(config)
    out = FAMILY.launch(inputs, config)
    ref = FAMILY.reference(inputs)
    assert FAMILY.same(ref, out)
    assert FAMILY.same(out, rejection_sample_mrv2(*inputs.args()))
    # The same seed, the same inputs; another seed, others.
    again = FAMILY.make_inputs(problem, seed=problem.vocab, device=DEVICE)
    assert torch.equal(again.target_logits, inputs.target_logits)
    other = FAMILY.make_inputs(problem, seed=problem.vocab + 1, device=DEVICE)
    assert not torch.equal(other.seed, inputs.seed)

    sampled, counts = (t.cpu() for t in out)
    req = next(r for r in range(len(counts)) if not bool(ref.near_tie[r].any()))
    last = int(counts[req]) - 1
    if problem.vocab > 1:
        changed = sampled.clone()
        changed[req, last] = (changed[req, last] + 1) % problem.vocab
        assert not FAMILY.same(ref, (changed, counts))
        assert not FAMILY.same((sampled, counts), (changed, counts))
    other_count = counts.clone()
    other_count[req] += -1 if int(counts[req]) > 1 else 1
    assert not FAMILY.same(ref, (sampled, other_count))
    assert not FAMILY.same((sampled, counts), (sampled, other_count))
    assert FAMILY.same((sampled, counts), (sampled.clone(), counts.clone()))


# --------------------------------------------------------------------------------------
# (f) vLLM 0.33: FLy windows, the release's semantics
# --------------------------------------------------------------------------------------


def run_fly(inputs: Mrv2Inputs, config: dict[str, int] | None = None) -> tuple[torch.Tensor, ...]:
    sampled, num_sampled = rejection_sample_mrv2(*inputs.args(), **inputs.kwargs(),
                                                 config=config)
    return sampled.cpu(), num_sampled.cpu()


@pytest.mark.parametrize("window", [0, 1, 2, 4])
def test_fly_greedy_windows_give_the_tokens_derived_by_hand(window: int) -> None:
    """Windows 1 and 2: deferrals confirmed and failed, confident rejections, no room
    left, placeholders and ruled-out drafts (:data:`tests.kernels.mrv2_cases.
    FLY_GREEDY_REQUESTS`). Window 0 (FLy off) and 4 (= k: never room for a window) on
    window 2's requests: the native tokens."""
    inputs, expected = fly_greedy_batch(window, requests=None if window in (1, 2) else 2)
    inputs = on_device(inputs)
    if window in (0, 4):
        expected = [_greedy_expected(inputs, req) for req in range(len(expected))]
    out = run_fly(inputs)
    assert output_lists(*out) == expected
    ref = rejection_sample_mrv2_reference(*inputs.args(), **inputs.fly_kwargs())
    assert output_lists(ref.sampled, ref.num_sampled) == expected
    assert not bool(ref.near_tie.any())
    past = torch.arange(out[0].shape[1])[None, :] >= out[1][:, None].long()
    assert bool((out[0][past] == -1).all())


#: Seeds where a window is confirmed (in random requests; in a greedy one).
FLY_CONFIG_CASES = [
    FlyCase(Mrv2Case(4, 5, 97, _F32, True, "random", draft_noise=0.3, seed=87), 1, "always"),
    FlyCase(Mrv2Case(5, 4, 300, _BF16, False, "mixed", placeholders=0.1, use_fp64=True,
                     seed=84), 2, "split"),
]
#: The default config, and small tiles split four ways (the draw's parts combined).
FLY_CONFIGS = [None, _SPACE.validate({"BLOCK_V": 256, "BLOCK_R": 256, "SPLITS": 4,
                                      "num_warps": 1, "num_stages": 1})]


@pytest.mark.parametrize("fly", FLY_CONFIG_CASES, ids=lambda f: f.id)
def test_fly_windows_are_the_references_under_every_config(fly: FlyCase) -> None:
    """Random and mixed batches: the reference's tokens (a near-tie apart), the same for
    configs that split the draw, and windows confirmed (tokens the native test would not
    give)."""
    inputs = on_device(build_fly(fly))
    ref = rejection_sample_mrv2_reference(*inputs.args(), **inputs.fly_kwargs())
    outs = [run_fly(inputs, config) for config in FLY_CONFIGS]
    ok, why = mrv2_results_agree(ref, outs[0])
    assert ok, why
    for config, out in zip(FLY_CONFIGS[1:], outs[1:], strict=True):
        assert torch.equal(out[0], outs[0][0]) and torch.equal(out[1], outs[0][1]), config
    native = reference(inputs)
    assert bool((ref.num_sampled > native.num_sampled).any())


def test_fly_windows_fold_the_sampling_parameters() -> None:
    """With ``apply_sampling_params`` the processed rows FLy measures are vLLM's (random
    requests truncated by top-k/top-p and min-p; greedy requests untouched, as vLLM's
    sampling parameters leave them): the unfolded reference on the processed rows, with
    windows confirmed in random and greedy requests."""
    fly = FlyCase(Mrv2Case(4, 4, 97, _F32, True, "mixed", draft_noise=0.2, seed=85), 1,
                  "always")
    inputs = build_fly(fly)
    states = inputs.temperature.shape[0]
    gen = torch.Generator().manual_seed(3)
    greedy = inputs.temperature == 0
    top_k = torch.where(greedy, 97, torch.randint(40, 97, (states,), generator=gen))
    top_p = torch.where(greedy, 1.0, 0.9 + 0.1 * torch.rand(states, generator=gen))
    min_p = torch.where(greedy, 0.0, 0.02)
    inputs = on_device(replace(inputs, apply_sampling_params=True, top_k=top_k.int(),
                               top_p=top_p.float(), min_p=min_p.float()))
    processed = unfolded_mrv2(inputs)
    ref = rejection_sample_mrv2_reference(*processed.args(), **processed.fly_kwargs())
    ok, why = mrv2_results_agree(ref, run_fly(inputs))
    assert ok, why
    native = rejection_sample_mrv2_reference(*processed.args())
    temps = inputs.temperature[inputs.idx_mapping.long()].cpu()
    confirmed = ref.num_sampled > native.num_sampled
    assert bool((confirmed & (temps == 0)).any()) and bool((confirmed & (temps > 0)).any())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"fly_window_size": 1, "vllm_version": "0.32"}, "FLy windows are vLLM 0.33"),
        ({"fly_window_size": -1}, "fly_window_size must be a non-negative int"),
        ({"fly_window_size": True}, "fly_window_size must be a non-negative int"),
        ({"fly_window_size": 1, "fly_entropy_top_k": 0}, "fly_entropy_top_k must be"),
        ({"fly_window_size": 1, "fly_entropy_threshold": "high"}, "fly_entropy_threshold"),
        ({"vllm_version": "0.34"}, "vllm_version must be one of"),
        ({"use_block_verification": True}, "block verification is not implemented"),
        ({"synthetic_conditional_rates": torch.ones(3)}, "synthetic acceptance"),
        ({"watermark_key": 5}, "watermark_key: watermarking is not implemented"),
        ({"contexts": torch.zeros(3, 2)}, "contexts: watermarking"),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else None,
)
def test_release_arguments_are_checked(change: dict[str, Any], message: str) -> None:
    inputs = _valid_inputs()
    kwargs = {**inputs.kwargs(), "vllm_version": "0.33", **change}
    with pytest.raises(ValueError, match=message):
        rejection_sample_mrv2(*inputs.args(), **kwargs)


def test_the_release_defaults_to_the_installed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """``vllm_version=None`` is the installed vLLM's release when supported, else the
    newest; without a FLy window both releases give the same tokens."""
    import spectune.kernels._vllm_version as versions
    from spectune.kernels import vllm_semantics_version

    installed = versions.installed_vllm_release()
    if installed in versions.SUPPORTED_VLLM_VERSIONS:
        assert vllm_semantics_version() == installed
    for release, expected in (("0.32", "0.32"), ("0.33", "0.33"), ("0.34", "0.33"),
                              (None, "0.33")):
        monkeypatch.setattr(versions, "installed_vllm_release", lambda r=release: r)
        assert vllm_semantics_version.__wrapped__() == expected
    inputs = _valid_inputs()
    old, new = (run_fly(replace(inputs, vllm_version=v)) for v in ("0.32", "0.33"))
    assert torch.equal(old[0], new[0]) and torch.equal(old[1], new[1])
