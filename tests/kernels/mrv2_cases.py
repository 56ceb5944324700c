"""Random MRV2 verification batches for the kernel tests, shaped as vLLM builds them.

One :class:`Mrv2Case` describes a batch (requests, ``k``, vocabulary, dtype, drafter kind,
temperatures, what to stress); :func:`build_mrv2` makes its arguments as vLLM's Model
Runner V2 passes them to ``rejection_sample``: target logits with temperature already
applied (each request's draft rows, then its bonus row), draft logits before temperature
indexed by request state and step, drafts shifted by one (``draft_sampled[r + 1]`` is
what row ``r`` verifies), more request states than requests in no particular order.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, replace

import torch

from spectune.kernels.rejection_mrv2 import Mrv2Inputs

__all__ = [
    "TEMPERATURES",
    "FlyCase",
    "Mrv2Case",
    "build_fly",
    "build_mrv2",
    "fly_greedy_batch",
    "fly_outcomes",
    "fuzz_cases",
    "output_lists",
]

#: Temperatures of random requests: from nearly greedy to nearly uniform.
TEMPERATURES = (1e-3, 0.05, 0.5, 1.0, 2.0, 10.0)
#: What a case can stress besides its shape.
FEATURES = (
    "",
    "masked",  # about half of each target row at -inf (top-k style), never its argmax,
               # and a third of the drafter's
    "q_eq_p",  # the drafter's distribution is the target's, exactly: p / q = 1
    "q_near_p",  # the drafter is the target with its draft a bit likelier: rejections
                 # resample a nearly empty residual (q / p just below 1 elsewhere)
    "ties",  # logits on a coarse grid: exact ties for the max
)


@dataclass(frozen=True)
class Mrv2Case:
    """One batch to build.

    Attributes:
        num_reqs: Requests in the batch.
        k: ``num_speculative_steps``.
        vocab: Target vocabulary size.
        dtype: Logits dtype (target and draft).
        draft_logits: Whether the drafter passes its logits (else ngram-like).
        temps: ``greedy``, ``random`` or ``mixed`` (both kinds in one batch).
        use_fp64: Gumbel-max in float64.
        ragged: Requests with fewer drafts than ``k`` (0 included); else all have ``k``.
        placeholders: Probability that a draft slot is a ``-1`` placeholder.
        spare_states: Request states beyond the batch's (vLLM's ``max_num_reqs``).
        draft_vocab_extra: Draft logits this much wider than the target's (padding full
            of large values: any read of it shows).
        strided: Target logits as a row slice of a wider buffer (``stride(0) > vocab``).
        draft_noise: Std of the drafter's logit noise: lower, longer chains.
        feature: One of :data:`FEATURES`.
        seed: Seed of every draw.
    """

    num_reqs: int
    k: int
    vocab: int
    dtype: torch.dtype = torch.float32
    draft_logits: bool = True
    temps: str = "mixed"
    use_fp64: bool = False
    ragged: bool = True
    placeholders: float = 0.0
    spare_states: int = 3
    draft_vocab_extra: int = 0
    strided: bool = False
    draft_noise: float = 1.0
    feature: str = ""
    seed: int = 0

    @property
    def id(self) -> str:
        dt = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[self.dtype]
        parts = [f"R{self.num_reqs}", f"k{self.k}", f"V{self.vocab}", dt, self.temps,
                 "dl" if self.draft_logits else "nodl"]
        parts += ["fp64"] * self.use_fp64 + ["full"] * (not self.ragged)
        parts += [f"ph{self.placeholders:g}"] * bool(self.placeholders)
        parts += [f"dv+{self.draft_vocab_extra}"] * bool(self.draft_vocab_extra)
        parts += ["strided"] * self.strided + [self.feature] * bool(self.feature)
        return "-".join([*parts, f"s{self.seed}"])


def _temperatures(case: Mrv2Case, states: int, gen: torch.Generator) -> torch.Tensor:
    pick = torch.randint(0, len(TEMPERATURES), (states,), generator=gen)
    temps = torch.tensor(TEMPERATURES, dtype=torch.float32)[pick]
    if case.feature == "q_eq_p" and case.dtype != torch.float32:
        # p == q exactly needs (x / t) rounded to the dtype == x rounded, then / t.
        temps = torch.ones(states)
    if case.temps == "greedy":
        temps = torch.zeros(states)
    elif case.temps == "mixed":
        temps = torch.where(torch.rand(states, generator=gen) < 0.4, 0.0, temps)
    return temps.to(torch.float32)


def build_mrv2(case: Mrv2Case) -> Mrv2Inputs:
    """The arguments of one ``rejection_sample`` call for ``case`` (CPU tensors)."""
    gen = torch.Generator().manual_seed(10_000 + case.seed)
    num_reqs, k, vocab = case.num_reqs, case.k, case.vocab
    if case.ragged:
        counts = torch.randint(0, k + 1, (num_reqs,), generator=gen)
        if num_reqs:
            counts[int(torch.randint(0, num_reqs, (), generator=gen))] = k
        if num_reqs > 1:
            counts[int(torch.randint(0, num_reqs, (), generator=gen))] = 0
    else:
        counts = torch.full((num_reqs,), k, dtype=torch.int64)
    rows_per_req = counts + 1
    cu = torch.zeros(num_reqs + 1, dtype=torch.int64)
    cu[1:] = rows_per_req.cumsum(0)
    rows = int(cu[-1])

    states = num_reqs + case.spare_states
    idx_mapping = torch.randperm(states, generator=gen)[:num_reqs]
    temps = _temperatures(case, states, gen)
    if case.temps == "mixed" and num_reqs > 1:
        # Both kinds in the batch, whatever the draw.
        temps[idx_mapping[0]] = 0.0
        temps[idx_mapping[-1]] = TEMPERATURES[case.seed % len(TEMPERATURES)]
    row_state = torch.repeat_interleave(idx_mapping, rows_per_req)
    row_temp = temps[row_state]
    local = torch.arange(rows) - torch.repeat_interleave(cu[:-1], rows_per_req)

    if case.feature == "ties":
        raw = torch.randint(0, 3, (rows, vocab), generator=gen).float() * 1.5
    else:
        raw = torch.randn(rows, vocab, generator=gen) * 2.0
        peaks = torch.randint(0, vocab, (rows, min(4, vocab)), generator=gen)
        raw.scatter_add_(1, peaks, torch.full(peaks.shape, 6.0))
    draft_raw = raw + torch.randn(rows, vocab, generator=gen) * case.draft_noise
    if case.feature == "q_eq_p":
        draft_raw = raw.clone()
    if case.feature == "masked" and vocab > 1:
        masked = torch.rand(rows, vocab, generator=gen) < 0.5
        masked.scatter_(1, raw.argmax(dim=-1, keepdim=True), False)
        raw = raw.masked_fill(masked, float("-inf"))
        # The drafter's own top-k: q(v) = 0 off its kept set (never its argmax).
        draft_masked = torch.rand(rows, vocab, generator=gen) < 0.3
        draft_masked.scatter_(1, draft_raw.argmax(dim=-1, keepdim=True), False)
        draft_raw = draft_raw.masked_fill(draft_masked, float("-inf"))
    # The target's logits come with temperature applied; greedy rows as they are.
    divisor = torch.where(row_temp > 0, row_temp, 1.0)[:, None]
    target = (raw / divisor).to(case.dtype)
    stored = draft_raw.to(case.dtype)  # the drafter's cache: before temperature

    # Drafts: from the drafter's distribution (random requests), mostly the target's
    # argmax (greedy requests); the first slot of a request holds its last token.
    drafts = torch.randint(0, vocab, (rows,), generator=gen)
    q = torch.softmax(stored.float() / divisor, dim=-1)
    sampled = torch.multinomial(q, 1, generator=gen).flatten() if rows else drafts
    argmax = target.float().argmax(dim=-1) if rows else drafts
    greedy_row = row_temp == 0
    keep_argmax = torch.rand(rows, generator=gen) < 0.75
    proposal = torch.where(greedy_row & keep_argmax, argmax, sampled)
    placeholder = torch.rand(rows, generator=gen) < case.placeholders
    proposal = torch.where(placeholder, -1, proposal)
    is_draft_row = local < counts.repeat_interleave(rows_per_req)
    draft_rows = torch.nonzero(is_draft_row).flatten()
    drafts[draft_rows + 1] = proposal[draft_rows]
    if case.feature == "q_near_p":
        # q(d) raised above p(d) at each row's own draft: rejections happen, and the
        # residual p - q is p scaled by a factor just above 0 off the draft.
        bump = torch.zeros(rows, vocab)
        ok = drafts[draft_rows + 1] >= 0
        bump[draft_rows[ok], drafts[draft_rows[ok] + 1]] = 0.7
        stored = (raw + bump).to(case.dtype) if case.dtype == torch.float32 else stored

    draft_logits = None
    if case.draft_logits:
        # Stale values everywhere a request does not own (other states, steps past its
        # drafts) and large values in the padding: reading any of them changes tokens.
        width = vocab + case.draft_vocab_extra
        draft_logits = torch.randn(states, k, width, generator=gen).to(case.dtype) * 3
        draft_logits[..., vocab:] = 40.0
        for r in draft_rows.tolist():
            draft_logits[row_state[r], local[r], :vocab] = stored[r]

    if case.strided and rows:
        buffer = torch.full((rows + 2, vocab + 37), 50.0, dtype=case.dtype)
        buffer[1 : rows + 1, :vocab] = target
        target = buffer[1 : rows + 1, :vocab]

    base = torch.randint(0, 2**20, (num_reqs,), generator=gen)
    pos = torch.repeat_interleave(base, rows_per_req) + local
    seeds = torch.randint(-(2**63), 2**63 - 1, (states,), generator=gen)
    return Mrv2Inputs(
        target_logits=target,
        draft_logits=draft_logits,
        draft_sampled=drafts.to(torch.int32 if case.seed % 3 == 0 else torch.int64),
        cu_num_logits=cu.to(torch.int32),
        pos=pos.to(torch.int64),
        idx_mapping=idx_mapping.to(torch.int32),
        expanded_idx_mapping=row_state.to(torch.int32),
        expanded_local_pos=local.to(torch.int32),
        temperature=temps,
        seed=seeds,
        num_speculative_steps=k,
        use_fp64=case.use_fp64,
    )


def fuzz_cases(count: int, *, seed: int, vocabs: tuple[int, ...]) -> list[Mrv2Case]:
    """``count`` random small cases (fixed ``seed``): shapes, dtypes, drafters, stresses."""
    rng = random.Random(seed)
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    cases = []
    for i in range(count):
        case = Mrv2Case(
            num_reqs=rng.randint(1, 8), k=rng.randint(1, 8), vocab=rng.choice(vocabs),
            dtype=rng.choice(dtypes), draft_logits=rng.random() < 0.6,
            temps=rng.choice(("greedy", "random", "mixed", "mixed", "random")),
            use_fp64=rng.random() < 0.4, ragged=rng.random() < 0.75,
            placeholders=rng.choice((0.0, 0.0, 0.1, 0.3)),
            spare_states=rng.randint(1, 5),
            draft_vocab_extra=rng.choice((0, 0, 0, 3, 100)),
            strided=rng.random() < 0.2, draft_noise=rng.choice((0.2, 0.5, 1.0, 2.0)),
            feature=rng.choice(("", "", "", "", "masked", "q_near_p", "ties")),
            seed=seed + i,
        )
        if case.feature == "q_near_p":
            case = replace(case, dtype=torch.float32, draft_logits=True)
        cases.append(case)
    return cases


def output_lists(sampled: torch.Tensor, num_sampled: torch.Tensor) -> list[list[int]]:
    """Each request's emitted tokens (what is past its count is not part of the output)."""
    sampled, num_sampled = sampled.cpu(), num_sampled.cpu()
    return [sampled[r, : int(num_sampled[r])].tolist() for r in range(sampled.shape[0])]


# --------------------------------------------------------------------------------------
# FLy windows (vLLM 0.33)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlyCase:
    """A batch verified with FLy windows.

    Attributes:
        case: The batch.
        window: ``fly_window_size`` (0: FLy off).
        threshold: ``always`` (0: every deferrable rejection is deferred), ``never`` (no
            entropy reaches it) or ``split`` (halfway between two middle entropies of the
            batch's draft rows: some rejections are deferred, some not).
        top_k: ``fly_entropy_top_k``.
    """

    case: Mrv2Case
    window: int
    threshold: str
    top_k: int = 3

    @property
    def id(self) -> str:
        return f"{self.case.id}-W{self.window}-{self.threshold}-top{self.top_k}"


def build_fly(fly: FlyCase) -> Mrv2Inputs:
    """The arguments of ``fly.case`` with its FLy window, under vLLM 0.33's semantics."""
    # Imported here: the public launcher module (the entropy vLLM computes).
    from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_fly import fly_entropy

    inputs = build_mrv2(fly.case)
    threshold = {"always": 0.0, "never": 1e9}.get(fly.threshold)
    if threshold is None:
        assert fly.threshold == "split", fly.threshold
        counts = torch.diff(inputs.cu_num_logits.long())
        local = inputs.expanded_local_pos.long()
        draft_rows = local < counts.repeat_interleave(counts) - 1
        entropies = fly_entropy(inputs.target_logits, fly.top_k)[draft_rows].unique()
        middle = len(entropies) // 2
        threshold = (float(entropies[max(middle - 1, 0)] + entropies[middle]) / 2
                     if len(entropies) > 1 else 0.0)
    return replace(inputs, fly_window_size=fly.window, fly_entropy_threshold=threshold,
                   fly_entropy_top_k=fly.top_k, vllm_version="0.33")


#: Greedy requests for :func:`fly_greedy_batch`, per window: each draft row's verdict and
#: target row, then the tokens FLy emits (``d<i>``: draft ``i``; ``a<i>``: the argmax of
#: row ``i``, the bonus row's when ``i`` is the draft count). ``acc``: the draft is the
#: argmax; ``rej``: a tied maximum after it (finite); ``masked``: a token at ``-inf``;
#: ``ph``: a ``-1`` placeholder. ``flat`` rows have three tied maxima (top-3 entropy about
#: ln 3), ``peaked`` rows one (entropy about 0); the threshold is 0.5.
FLY_GREEDY_REQUESTS: dict[int, list[tuple[list[str], list[str]]]] = {
    1: [
        # Deferred, then confirmed by the next draft; the chain goes on to the bonus row.
        (["rej flat", "acc peaked", "acc flat"], ["d0", "d1", "d2", "a3"]),
        # Deferred, and the window's draft is rejected: back to the deferred row.
        (["rej flat", "rej flat", "acc peaked"], ["a0"]),
        # A confident rejection is not deferred.
        (["acc flat", "rej peaked", "acc flat"], ["d0", "a1"]),
        # No window left after the last draft.
        (["acc peaked", "rej flat"], ["d0", "a1"]),
        # A placeholder in the window fails it.
        (["rej flat", "ph flat", "acc peaked"], ["a0"]),
        # A draft the target rules out (-inf) is never deferred.
        (["masked flat", "acc peaked"], ["a0"]),
        # Two windows, both confirmed.
        (["rej flat", "acc peaked", "rej flat", "acc peaked", "acc flat"],
         ["d0", "d1", "d2", "d3", "d4", "a5"]),
        # A window confirmed, then a confident rejection.
        (["rej flat", "acc flat", "rej peaked", "acc flat"], ["d0", "d1", "a2"]),
        # No drafts: the bonus row only.
        ([], ["a0"]),
    ],
    2: [
        (["rej flat", "acc flat", "acc peaked", "acc flat"], ["d0", "d1", "d2", "d3", "a4"]),
        # The window's second draft is rejected: back to the deferred row.
        (["rej flat", "acc flat", "rej flat", "acc peaked"], ["a0"]),
        # Two drafts left are not a window of two.
        (["acc flat", "acc peaked", "rej flat", "acc flat"], ["d0", "d1", "a2"]),
        (["rej flat", "acc flat"], ["a0"]),
    ],
}
FLY_GREEDY_THRESHOLD = 0.5


def fly_greedy_batch(
    window: int, *, requests: int | None = None, vocab: int = 16
) -> tuple[Mrv2Inputs, list[list[int]]]:
    """A greedy batch of :data:`FLY_GREEDY_REQUESTS` (``window``'s, verified with
    ``window``, or another window's with ``requests``) and the tokens FLy emits for it
    (``window``'s list, whatever ``window`` is)."""
    specs = FLY_GREEDY_REQUESTS[window if requests is None else requests]
    counts = [len(rows) for rows, _ in specs]
    k = max(counts)
    row_logits: list[torch.Tensor] = []
    # One slot per row: a request's first holds its last token (never read), then
    # draft_sampled[r + 1] is the draft row r verifies.
    slots: list[int] = []
    expected = []
    for req, (rows, tokens) in enumerate(specs):
        argmaxes, own = [], []
        for step, spec in enumerate([*rows, "bonus peaked"]):
            verdict, shape = spec.split()
            top = (3 * req + 5 * step) % (vocab - 3)
            x = torch.full((vocab,), -2.0)
            x[top : top + (3 if shape == "flat" else 1)] = 5.0 if shape == "flat" else 10.0
            # A rejected draft is a tied maximum after the first (flat) or below it.
            draft = {"acc": top, "rej": top + (1 if shape == "flat" else 2),
                     "masked": top + 1, "ph": -1}.get(verdict, 0)
            if verdict == "masked":
                x[draft] = -math.inf
            row_logits.append(x)
            argmaxes.append(top)
            if verdict != "bonus":
                own.append(draft)
        slots += [0, *own]
        expected.append([own[int(t[1:])] if t[0] == "d" else argmaxes[int(t[1:])]
                         for t in tokens])
    rows_per_req = torch.tensor(counts) + 1
    cu = torch.zeros(len(counts) + 1, dtype=torch.int64)
    cu[1:] = rows_per_req.cumsum(0)
    states = len(counts) + 2
    idx_mapping = torch.randperm(states, generator=torch.Generator().manual_seed(window))
    idx_mapping = idx_mapping[: len(counts)].to(torch.int32)
    num_rows = int(cu[-1])
    local = torch.arange(num_rows) - torch.repeat_interleave(cu[:-1], rows_per_req)
    inputs = Mrv2Inputs(
        target_logits=torch.stack(row_logits),
        draft_logits=torch.randn(states, k, vocab, generator=torch.Generator().manual_seed(7)),
        draft_sampled=torch.tensor(slots, dtype=torch.int64),
        cu_num_logits=cu.to(torch.int32),
        pos=torch.arange(num_rows, dtype=torch.int64) + 100,
        idx_mapping=idx_mapping,
        expanded_idx_mapping=idx_mapping.repeat_interleave(rows_per_req),
        expanded_local_pos=local.to(torch.int32),
        temperature=torch.zeros(states),
        seed=torch.arange(states, dtype=torch.int64),
        num_speculative_steps=k,
        fly_window_size=window,
        fly_entropy_threshold=FLY_GREEDY_THRESHOLD,
        vllm_version="0.33",
    )
    return inputs, expected


def fly_outcomes(inputs: Mrv2Inputs) -> Counter[str]:
    """What FLy's windows do in a batch, by kind of request: ``"<greedy|random>
    confirmed"`` (a deferred draft accepted), ``"<...> failed"`` (a window's draft
    rejected), ``"below threshold"`` (a rejection that could be deferred, kept for its
    entropy). Decided as the reference decides (float64), for guarding the test cases."""
    # White-box: the reference's per-row tests.
    from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_ref import _Rows

    window = inputs.fly_window_size
    threshold = float(torch.tensor(inputs.fly_entropy_threshold, dtype=torch.float32))
    cu = inputs.cu_num_logits.tolist()
    seen: Counter[str] = Counter()
    for req in range(len(cu) - 1):
        state = int(inputs.idx_mapping[req])
        temp = float(inputs.temperature[state])
        kind = "greedy" if temp == 0.0 else "random"
        rows = _Rows(target=inputs.target_logits.float(), draft=inputs.draft_logits,
                     drafts=inputs.draft_sampled.long(), positions=inputs.pos, state=state,
                     temp=temp, seed=int(inputs.seed[state]), use_fp64=inputs.use_fp64,
                     rtol=1e-5)
        start, n_drafts = cu[req], cu[req + 1] - cu[req] - 1
        pending = -1
        for step in range(n_drafts if window else 0):
            accepted, deferrable, _ = rows.native(start + step, step)
            if pending >= 0:
                if not accepted:
                    seen[f"{kind} failed"] += 1
                    break
                if step - pending == window:
                    seen[f"{kind} confirmed"] += 1
                    pending = -1
            elif not accepted:
                room = deferrable and step + window < n_drafts
                if room and rows.entropy(start + step, inputs.fly_entropy_top_k) >= threshold:
                    pending = step
                    continue
                seen["below threshold"] += room
                break
    return +seen
