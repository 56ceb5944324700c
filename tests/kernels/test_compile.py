"""The kernels compile for GPU targets, on a host without a GPU.

The other kernel tests run Triton's interpreter, which accepts Python that the compiler
refuses (a module global that is not a ``tl.constexpr``, for one). Here Triton's
compiler builds every kernel the launcher launches, with its constexpr flags on, for an
NVIDIA H100/H200 (``sm_90``) and an AMD MI300X (``gfx942``), down to PTX and AMDGCN.
No device is needed; it runs in a subprocess because ``TRITON_INTERPRET=1`` (set for
the other tests) makes ``@triton.jit`` build interpreter functions instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (kernel, constexprs) as the launcher launches them: random rows, seeded, with draft
# probabilities (every shared constant in use); once more with host draws in float64.
_COMPILE = r"""
import json, sys
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

# White-box: the kernels themselves, by module.
import spectune.kernels.rejection.rejection_sample as rejection
import spectune.kernels.rejection_mrv2.rejection_sample_mrv2 as rejection_mrv2
import spectune.kernels.rejection_mrv2.rejection_sample_mrv2_fly as fly
from spectune.kernels import _folding
from spectune.kernels._truncation import ROUNDED_DIV, TRITON_DIV
from spectune.kernels.rejection.rejection_sample_constants import FIXED_POINT_BITS

TYPES = {
    "x_ptr": "*bf16", "dp_ptr": "*fp32", "draft_ptr": "*i32", "cu_ptr": "*i32",
    "greedy_ptr": "*i1", "u_ptr": "*fp64", "q_ptr": "*fp32", "seed_ptr": "*i64",
    "part_max_ptr": "*fp32", "part_arg_ptr": "*i32", "part_score_ptr": "*fp32",
    "part_idx_ptr": "*i32", "accept_ptr": "*i8", "part_sum_ptr": "*i64", "out_ptr": "*i32",
    "bonus_ptr": "*i64", "vocab": "i32", "batch": "i32", "n_tiles": "i32", "chunk": "i32",
    "max_spec_len": "i32",
    # Folded sampling parameters: the pre-pass's inputs and outputs.
    "fold_temp_ptr": "*fp32", "fold_min_ptr": "*fp32", "fold_key_ptr": "*i64",
    "x_stride": "i64", "sel_ptr": "*i64", "temp_ptr": "*fp32", "min_p_ptr": "*fp32",
    "k_ptr": "*i32", "p_ptr": "*fp32", "out_temp_ptr": "*fp32", "out_min_ptr": "*fp32",
    "out_key_ptr": "*i64",
    # Model Runner V2's verification.
    "t_ptr": "*bf16", "t_stride": "i64", "d_ptr": "*bf16", "d_stride0": "i64",
    "d_stride1": "i64", "drafts_ptr": "*i64", "idx_map_ptr": "*i32", "t_gmax_ptr": "*fp32",
    "t_gsum_ptr": "*i64", "d_gmax_ptr": "*fp32", "d_gsum_ptr": "*i64", "n_groups": "i32",
    "pos_ptr": "*i64",
    # vLLM 0.33's FLy windows.
    "entropy_ptr": "*fp32", "accepted_ptr": "*i32", "window": "i32", "threshold": "fp32",
    "sampled_ptr": "*i64", "num_sampled_ptr": "*i32",
}
RANDOM = {"HAS_DRAFT_PROBS": True, "SEEDED": True, "FRAC": FIXED_POINT_BITS}
V1_FOLD = {"FOLD": ROUNDED_DIV.value}
LAUNCHES = [
    (rejection, "_fused_row_kernel", {"BLOCK_V": 1024, "BLOCK_B": 8, "ALL_GREEDY": False,
                                      "SCORE_DTYPE": tl.float32, **RANDOM, "FOLD": 0}),
    (rejection, "_fused_row_kernel", {"BLOCK_V": 1024, "BLOCK_B": 8, "ALL_GREEDY": False,
                                      "SCORE_DTYPE": tl.float64, **RANDOM, "SEEDED": False,
                                      **V1_FOLD}),
    (rejection, "_split_max_kernel", {"SPLITS": 4, "BLOCK_V": 2048}),
    (rejection, "_split_sum_kernel", {"SPLITS": 4, "BLOCK_S": 4, "BLOCK_V": 2048,
                                      "BLOCK_B": 16, "FRAC": FIXED_POINT_BITS, **V1_FOLD}),
    (rejection, "_split_recover_kernel", {"SPLITS": 8, "BLOCK_S": 8, "BLOCK_V": 512,
                                          "BLOCK_B": 4, "SCORE_DTYPE": tl.float32, **RANDOM,
                                          **V1_FOLD}),
    (rejection, "_finalize_kernel", {"SPLITS": 4, "BLOCK_S": 4, "BLOCK_K": 8,
                                     "ALL_GREEDY": False}),
    # The fold's pre-pass, with either division, and MRV2's folded passes.
    (_folding, "_fold_rows_kernel", {"DIV": ROUNDED_DIV.value, "HAS_MIN_P": True,
                                     "HAS_K": True, "HAS_P": True, "BLOCK_V": 1024,
                                     "PIVOTS": 16}),
    (_folding, "_fold_rows_kernel", {"DIV": TRITON_DIV.value, "HAS_MIN_P": False,
                                     "HAS_K": True, "HAS_P": True, "BLOCK_V": 2048,
                                     "PIVOTS": 8}),
    (rejection_mrv2, "_stats_kernel", {"STEPS": 3, "SPLITS": 2, "BLOCK_V": 1024,
                                       "FRAC": FIXED_POINT_BITS, "HAS_DRAFT_LOGITS": True,
                                       "FOLD": TRITON_DIV.value}),
    (rejection_mrv2, "_decide_kernel", {"STEPS": 3, "SPLITS": 2, "BLOCK_R": 512,
                                        "BLOCK_G": 8, "FRAC": FIXED_POINT_BITS,
                                        "HAS_DRAFT_LOGITS": True, "USE_FP64": False,
                                        "FOLD": TRITON_DIV.value}),
    (fly, "_processed_rows_kernel", {"BLOCK_V": 1024, "FOLD": TRITON_DIV.value}),
    (fly, "_fly_decide_kernel", {"STEPS": 3, "SPLITS_V": 2, "BLOCK_SV": 2, "SPLITS": 2,
                                 "BLOCK_R": 512, "BLOCK_G": 8, "FRAC": FIXED_POINT_BITS,
                                 "HAS_DRAFT_LOGITS": True, "USE_FP64": False}),
    (fly, "_fly_chain_kernel", {"STEPS": 3, "SPLITS_V": 2, "BLOCK_SV": 2, "SPLITS_R": 2,
                                "BLOCK_SR": 2, "BLOCK_K": 4}),
]
TARGETS = {"cuda": GPUTarget("cuda", 90, 32), "hip": GPUTarget("hip", "gfx942", 64)}
out = []
for backend in sys.argv[1:]:
    for module, name, constexprs in LAUNCHES:
        fn = getattr(module, name)
        signature = {a: "constexpr" if a in constexprs else TYPES[a] for a in fn.arg_names}
        indexed = {(fn.arg_names.index(a),): v for a, v in constexprs.items()}
        compiled = triton.compile(ASTSource(fn, signature, constexprs=indexed),
                                  target=TARGETS[backend], options={"num_warps": 4})
        asm = compiled.asm["ptx" if backend == "cuda" else "amdgcn"]
        out.append({"backend": backend, "kernel": name, "asm_has_kernel": name in asm})
print(json.dumps(out))
"""


def test_every_launched_kernel_compiles_for_cuda_and_hip() -> None:
    from triton.backends import backends

    wanted = [b for b, name in (("cuda", "nvidia"), ("hip", "amd")) if name in backends]
    assert wanted, f"this triton build has no GPU backend: {sorted(backends)}"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE, *wanted], capture_output=True, text=True, env=env,
        cwd=ROOT, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout.splitlines()[-1])
    assert len(results) == 13 * len(wanted)
    assert all(r["asm_has_kernel"] for r in results), results
