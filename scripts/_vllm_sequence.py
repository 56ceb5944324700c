"""An unfused baseline with vLLM 0.32's launch sequence and launch parameters.

Written for the benchmark from vLLM's semantics (not its code): torch argmax, torch
float32 softmax (written to memory), torch uniform/exponential/reciprocal, then the
per-request greedy kernel, the recovered-token kernel over a (batch, max_spec_len) grid
with an 8192-wide vocab tile, and the per-request random kernel; Triton's default 4
warps. Only the shapes of the work matter here; correctness is checked against our
reference in the benchmark.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# vLLM 0.32's fixed launch parameters for the recovered-token kernel.
VLLM_BLOCK_SIZE = 8192


@triton.jit
def _greedy_chain(out_ptr, cu_ptr, draft_ptr, argmax_ptr, bonus_ptr, greedy_ptr, max_spec_len,
                  ALL_GREEDY: tl.constexpr):
    req = tl.program_id(0)
    if not ALL_GREEDY and not tl.load(greedy_ptr + req):
        return
    start = tl.load(cu_ptr + req - 1, mask=req > 0, other=0)
    n = tl.load(cu_ptr + req) - start
    rejected = False
    for pos in range(n):
        if not rejected:
            d = tl.load(draft_ptr + start + pos)
            t = tl.load(argmax_ptr + start + pos).to(tl.int32)
            tl.store(out_ptr + req * (max_spec_len + 1) + pos, t)
            rejected = d != t
    if not rejected:
        tl.store(out_ptr + req * (max_spec_len + 1) + n, tl.load(bonus_ptr + req).to(tl.int32))


@triton.jit
def _recover(out_ptr, cu_ptr, draft_ptr, dp_ptr, p_ptr, q_ptr, vocab,
             BLOCK: tl.constexpr, HAS_DP: tl.constexpr):
    req = tl.program_id(0)
    start = tl.load(cu_ptr + req - 1, mask=req > 0, other=0)
    n = tl.load(cu_ptr + req) - start
    pos = tl.program_id(1)
    if pos >= n:
        return
    row = (start + pos).to(tl.int64)
    d = tl.load(draft_ptr + row)
    best = tl.full((), float("-inf"), tl.float32)
    best_idx = 0
    for v in range(0, vocab, BLOCK):
        offs = v + tl.arange(0, BLOCK)
        m = offs < vocab
        p = tl.load(p_ptr + row * vocab + offs, mask=m, other=0.0)
        if HAS_DP:
            p = tl.maximum(p - tl.load(dp_ptr + row * vocab + offs, mask=m, other=0.0), 0.0)
        else:
            p = tl.where(offs == d, 0.0, p)
        s = p * tl.load(q_ptr + req * vocab + offs, mask=m, other=0.0)
        s = tl.where(m, s, float("-inf"))
        tmax, targ = tl.max(s, axis=0, return_indices=True)
        if tmax > best:
            best = tmax
            best_idx = v + targ
    tl.store(out_ptr + row, best_idx)


@triton.jit
def _random_chain(out_ptr, cu_ptr, draft_ptr, dp_ptr, p_ptr, bonus_ptr, rec_ptr, u_ptr, greedy_ptr,
                  max_spec_len, vocab, HAS_DP: tl.constexpr):
    req = tl.program_id(0)
    if tl.load(greedy_ptr + req):
        return
    start = tl.load(cu_ptr + req - 1, mask=req > 0, other=0)
    n = tl.load(cu_ptr + req) - start
    rejected = False
    for pos in range(n):
        if not rejected:
            row = (start + pos).to(tl.int64)
            d = tl.load(draft_ptr + row)
            u = tl.load(u_ptr + row)
            if d < 0:
                ok = False
            else:
                if HAS_DP:
                    dp = tl.load(dp_ptr + row * vocab + d)
                else:
                    dp = 1.0
                ok = dp > 0 and tl.load(p_ptr + row * vocab + d) / dp >= u
            if ok:
                t = d
            else:
                rejected = True
                t = tl.load(rec_ptr + row)
            tl.store(out_ptr + req * (max_spec_len + 1) + pos, t)
    if not rejected:
        tl.store(out_ptr + req * (max_spec_len + 1) + n, tl.load(bonus_ptr + req).to(tl.int32))


def vllm_sequence(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    *,
    max_spec_len: int,
    draft_probs: torch.Tensor | None,
    is_greedy: torch.Tensor | None,
) -> torch.Tensor:
    """Run the unfused sequence; random draws are made in torch, as vLLM makes them."""
    batch = cu_num_draft_tokens.shape[0]
    n_rows, vocab = target_logits.shape
    device = target_logits.device
    logits = target_logits.float()
    out = torch.full((batch, max_spec_len + 1), -1, dtype=torch.int32, device=device)
    bonus = bonus_token_ids.reshape(batch)
    all_greedy = is_greedy is None
    all_random = is_greedy is not None and not bool(is_greedy.any())
    greedy = is_greedy if is_greedy is not None else out
    if not all_greedy:
        uniform = torch.rand(n_rows, dtype=torch.float64, device=device)
    if not all_random:
        argmax = logits.argmax(dim=-1)
        _greedy_chain[(batch,)](out, cu_num_draft_tokens, draft_token_ids, argmax, bonus,
                                greedy, max_spec_len, ALL_GREEDY=all_greedy)
        if all_greedy:
            return out
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    inv_q = torch.empty(batch, vocab, device=device).exponential_().reciprocal()
    recovered = torch.empty_like(draft_token_ids)
    dp = draft_probs if draft_probs is not None else probs
    _recover[(batch, max_spec_len)](recovered, cu_num_draft_tokens, draft_token_ids, dp, probs,
                                    inv_q, vocab, BLOCK=VLLM_BLOCK_SIZE,
                                    HAS_DP=draft_probs is not None)
    _random_chain[(batch,)](out, cu_num_draft_tokens, draft_token_ids, dp, probs, bonus,
                            recovered, uniform, greedy, max_spec_len, vocab,
                            HAS_DP=draft_probs is not None)
    return out
