"""A family's source hash covers its kernels and launcher: their code, not their text,
nor where their modules live.

The unit tests check :func:`canonical_code` on small sources. The package tests copy
``spectune/`` to a temporary folder, edit one file of the copy, import the copy in a
fresh interpreter and read ``family_hashes()`` from it: what every tuned row is checked
against. The hashes are pinned: those of the kernels before they moved into family
subpackages (commit fbfd1de), so every row tuned before the move is still used.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# White-box: the hash's own module.
from spectune.kernels import FAMILIES, _code_hash, family_hashes, gumbel_sample
from spectune.kernels._code_hash import canonical_code, code_digest, code_hash

ROOT = Path(__file__).resolve().parents[2]

_SOURCE = '''
"""Module docstring."""

import triton

LIMIT = 2**21 - 1  # a comment


@triton.jit
def _kernel(x_ptr, n, BLOCK: tl.constexpr):
    """Kernel docstring."""
    offs = tl.arange(0, BLOCK)
    # Strictly greater: the first index wins.
    return tl.load(x_ptr + offs, mask=offs < n, other=0.0)


class Launcher:
    """Class docstring."""

    def run(self, x, *, n):
        """Method docstring."""
        return _kernel[(1,)](x, n, BLOCK=256)
'''


def test_docstrings_comments_and_formatting_do_not_count() -> None:
    edits = [
        ('"""Module docstring."""', '"""Another module docstring,\n\nin two."""'),
        ('"""Kernel docstring."""', '"""What the kernel does."""'),
        ('    """Class docstring."""\n', ""),
        ("# a comment", "# another comment"),
        ("    # Strictly greater: the first index wins.\n", ""),
        ("return tl.load(x_ptr + offs, mask=offs < n, other=0.0)",
         "return tl.load(\n        x_ptr + offs,\n        mask=(offs < n),\n"
         "        other=0.0,\n    )"),
        ("\n\n\nclass", "\n\nclass"),
    ]
    edited = _SOURCE
    for old, new in edits:
        assert edited.count(old) == 1, old
        edited = edited.replace(old, new)
    assert canonical_code(edited) == canonical_code(_SOURCE)


@pytest.mark.parametrize(
    "old,new",
    [
        ("2**21 - 1", "2**21 - 2"),
        ("other=0.0", "other=1.0"),
        ("BLOCK=256", "BLOCK=512"),
        ("offs < n", "offs <= n"),
        ("def run(self, x, *, n)", "def run(self, x, n)"),
        ("import triton", "import triton as tr"),
    ],
)
def test_code_changes_count(old: str, new: str) -> None:
    assert canonical_code(_SOURCE.replace(old, new)) != canonical_code(_SOURCE)


def test_a_string_that_is_not_a_docstring_counts() -> None:
    source = "def f():\n    x = 1\n    'not a docstring'\n    return x\n"
    assert canonical_code(source) != canonical_code(source.replace("'not a", "'still not a"))
    assert "not a docstring" in canonical_code(source)


def test_canonical_text_leaves_out_empty_fields() -> None:
    """Fields newer Pythons add to nodes (empty in our code) must not reach the hash.

    ``ast.dump`` differs between Python 3.10, 3.12 and 3.13 on the same source
    (``type_params``; empty fields shown or not), and the plugin may run on another
    Python than the tuner.
    """
    text = canonical_code("def f(x):\n    return x\n")
    assert text == (
        "Module(body=[FunctionDef(name='f', args=arguments(args=[arg(arg='x')]), "
        "body=[Return(value=Name(id='x', ctx=Load()))])])"
    )


#: Every family's source hash at commit fbfd1de, the last one with every kernel module
#: flat in spectune/kernels/ (``git worktree add /tmp/fbfd1de fbfd1de``; there,
#: ``python -c "import spectune.kernels as k; print(k.family_hashes())"``). The move into
#: family subpackages changed no kernel's code, so it changed no hash: every row tuned
#: before it is still used. An edit of a family's hashed code changes its hash on
#: purpose (its tuned rows go stale): update the value here with it.
PINNED_HASHES = {
    "rejection_sample": "77a8bd135a11bb18",
    "rejection_sample_mrv2": "f65ef80eabad1517",
    "rejection_sample_folded": "77a8bd135a11bb18",
    "rejection_sample_mrv2_folded": "f65ef80eabad1517",
    # vLLM 0.33's semantics: a cached column mixed into the seed (a constexpr branch).
    "gumbel_sample": "901476e344af571f",
    "temperature": "013bbb3434f05cea",
    "min_p": "42dd645a41f91389",
    "top_k_top_p": "17b3212e85c41995",
    "sample": "c96d7d300629b10e",
}


def test_the_hashes_are_the_pinned_ones() -> None:
    assert family_hashes() == PINNED_HASHES


@pytest.mark.parametrize(
    "moved,before",
    [
        ("from spectune.kernels.rejection.rejection_sample_space import FOLDED as _folded_space",
         "from spectune.kernels import rejection_folded_space as _folded_space"),
        ("from spectune.kernels.rejection_mrv2.rejection_sample_mrv2_space import (\n"
         "    FOLDED as _folded_space,\n)",
         "from spectune.kernels import rejection_mrv2_folded_space as _folded_space"),
        ("from spectune.kernels.rejection.rejection_sample_constants import MAX_VOCAB, GROUP",
         "from spectune.kernels.rejection_constants import MAX_VOCAB, GROUP"),
        ("from spectune.kernels.sampling.top_k_top_p_space import default_config",
         "from spectune.kernels.topk_topp_space import default_config"),
        ("from spectune.kernels.sampling import sample_space as s",
         "from spectune.kernels import sampling_space as s"),
        ("import spectune.kernels.sampling.gumbel_sample as g",
         "import spectune.kernels.gumbel as g"),
    ],
)
def test_moved_imports_are_written_as_before_the_move(moved: str, before: str) -> None:
    assert canonical_code(moved) == canonical_code(before)
    assert canonical_code(f"def f():\n    {moved.replace(chr(10), '')}\n") == canonical_code(
        f"def f():\n    {before}\n")


@pytest.mark.parametrize(
    "source",
    [
        "from spectune.kernels._reductions import split_row",
        "from spectune.kernels import _launch, _reductions",
        "from . import rejection_sample_space",
        "from spectune.kernels.sampling import rows_problem",
        "import triton.language as tl",
    ],
)
def test_other_imports_are_written_as_they_are(source: str) -> None:
    import ast

    node = ast.parse(source).body[0]
    assert isinstance(node, ast.Import | ast.ImportFrom)
    assert _code_hash._as_before_moves(node) is node


def test_the_registered_hashes_are_code_hashes() -> None:
    k = "spectune.kernels."
    v1, mrv2 = k + "rejection.rejection_sample", k + "rejection_mrv2.rejection_sample_mrv2"
    v1_constants = k + "rejection.rejection_sample_constants"
    mrv2_constants = k + "rejection_mrv2.rejection_sample_mrv2_constants"
    counter_rng, launch, reductions = k + "_counter_rng", k + "_launch", k + "_reductions"
    folding, truncation = k + "_folding", k + "_truncation"

    assert family_hashes() == {name: f.source_hash for name, f in FAMILIES.items()}
    assert sorted(family_hashes()) == [
        "gumbel_sample", "min_p", "rejection_sample", "rejection_sample_folded",
        "rejection_sample_mrv2", "rejection_sample_mrv2_folded", "sample", "temperature",
        "top_k_top_p",
    ]
    assert family_hashes()["top_k_top_p"] == code_hash(k + "sampling.top_k_top_p", truncation,
                                                       v1_constants, launch)
    assert family_hashes()["sample"] == code_hash(
        k + "sampling.sample", truncation, counter_rng, reductions, v1_constants, launch)
    assert family_hashes()["gumbel_sample"] == code_hash(k + "sampling.gumbel_sample",
                                                         counter_rng, reductions, launch)
    assert family_hashes()["temperature"] == code_hash(k + "sampling.temperature", launch)
    assert family_hashes()["min_p"] == code_hash(k + "sampling.min_p", reductions, launch)
    with pytest.raises(TypeError, match="code hashes are of modules"):
        code_hash(gumbel_sample)  # type: ignore[arg-type]
    assert family_hashes()["rejection_sample"] == code_hash(
        v1, v1_constants, reductions, launch, folding, truncation
    )
    assert family_hashes()["rejection_sample_mrv2"] == code_hash(
        mrv2, mrv2_constants, counter_rng, v1_constants, reductions, launch, folding, truncation,
    )
    # The folded families launch the same kernels (their own names, spaces and rows).
    assert family_hashes()["rejection_sample_folded"] == family_hashes()["rejection_sample"]
    assert (family_hashes()["rejection_sample_mrv2_folded"]
            == family_hashes()["rejection_sample_mrv2"])
    assert len(code_hash(v1)) == 16
    assert code_hash(v1) != code_hash(v1, v1_constants)
    # A module object hashes as its name does.
    import spectune.kernels.rejection.rejection_sample as v1_module

    assert code_hash(v1_module) == code_hash(v1)


# --------------------------------------------------------------------------------------
# Edits to a copy of the package, imported for real
# --------------------------------------------------------------------------------------

# (file under spectune/kernels, text in it, its replacement) per edit.
_SAME = {
    "kernel module docstring": (
        "rejection/rejection_sample.py",
        "Chain verification of speculative drafts: greedy and rejection",
        "Chain verification of speculative drafts, greedy and rejection"),
    "kernel docstring": (
        "_reductions.py", '"""Max of x[lo : lo + n_tiles * BLOCK_V] (clipped to vocab), first',
        '"""The max of x[lo : lo + n_tiles * BLOCK_V] (clipped to vocab), first'),
    "launcher docstring": (
        "rejection/rejection_sample.py",
        "Verify speculative drafts against target logits; vLLM 0.32 V1 semantics.",
        "Verify drafts against the target's logits, with vLLM 0.32's V1 semantics."),
    "kernel comment": (
        "_reductions.py", "# Strictly greater: an earlier tile keeps a tie (first index overall).",
        "# Strictly greater, so that an earlier tile keeps a tie.\n        # (Another line.)"),
    "formatting": (
        "rejection/rejection_sample.py", "    return req, start\n",
        "    return (\n        req,\n        start,\n    )\n"),
    "constants docstring": (
        "rejection/rejection_sample_constants.py",
        "Numbers the rejection-sampling kernels and the host code",
        "Values the rejection-sampling kernels and the host code"),
    "reference": (
        "rejection/rejection_sample_ref.py", "NEAR_TIE_RTOL = 1e-5", "NEAR_TIE_RTOL = 2e-5"),
    "input generator": (
        "_synthetic_inputs.py", "_LOGIT_SCALE = 2.0", "_LOGIT_SCALE = 3.0"),
    "default config": (
        "rejection/rejection_sample_space.py",
        "_DEFAULT_BLOCK_V = 8192", "_DEFAULT_BLOCK_V = 4096"),
    "shared space parts": (
        "_space_parts.py", "_DEFAULT_NUM_STAGES = 2", "_DEFAULT_NUM_STAGES = 3"),
    "family adapter": (
        "rejection/rejection_sample_family.py", '"""The problem ``inputs`` belong to',
        '"""The tuning problem of ``inputs``'),
    "mrv2 reference": (
        "rejection_mrv2/rejection_sample_mrv2_ref.py",
        "MRV2_NEAR_TIE_RTOL = 1e-5", "MRV2_NEAR_TIE_RTOL = 2e-5"),
    "host random numbers": (
        "_counter_rng_host.py", "_RAND_SCALE = 4.6566127342e-10",
        "_RAND_SCALE = 4.6566127342e-10  # tl.rand's"),
    "mrv2 kernel docstring": (
        "_counter_rng.py", '"""One 32-bit block of MurmurHash3',
        '"""A 32-bit block of MurmurHash3'),
}
V1, MRV2, GUMBEL = "rejection_sample", "rejection_sample_mrv2", "gumbel_sample"
TEMPERATURE, MIN_P = "temperature", "min_p"
TOPK_TOPP, SAMPLE = "top_k_top_p", "sample"
V1F, MRV2F = "rejection_sample_folded", "rejection_sample_mrv2_folded"
# Per edit: the families whose source hash it must change (and no other).
_CHANGED = {
    "kernel code": (
        "rejection/rejection_sample.py", "other=2**31 - 1", "other=2**31 - 2", {V1, V1F}),
    "launcher code": (
        "rejection/rejection_sample.py",
        "_FINALIZE_NUM_WARPS = 1", "_FINALIZE_NUM_WARPS = 2", {V1, V1F}),
    "input checks": (
        "rejection/rejection_sample.py",
        "if vocab > MAX_VOCAB:", "if vocab >= MAX_VOCAB:", {V1, V1F}),
    "shared constant": (
        "rejection/rejection_sample_constants.py", "FIXED_POINT_BITS = 42", "FIXED_POINT_BITS = 41",
        {V1, MRV2, TOPK_TOPP, SAMPLE, V1F, MRV2F}),
    "shared reduction": (
        "_reductions.py",
        "return_indices=True)\n    return tl.load(index_ptr + row * SPLITS + which)",
        "return_indices=True)\n    return tl.load(index_ptr + row * SPLITS + which) + 0",
        {V1, MRV2, GUMBEL, MIN_P, SAMPLE, V1F, MRV2F}),
    "mrv2 kernel code": (
        "rejection_mrv2/rejection_sample_mrv2.py", "scaled = (gsum.to(tl.float64) * scale + 0.5)",
        "scaled = (gsum.to(tl.float64) * scale + 0.25)", {MRV2, MRV2F}),
    "random stream": (
        "_counter_rng.py", "h = rotl32(h ^ k, 13)", "h = rotl32(h ^ k, 12)",
        {MRV2, GUMBEL, SAMPLE, MRV2F}),
    "gumbel launcher code": (
        "sampling/gumbel_sample.py", "_REDUCE_NUM_WARPS = 1", "_REDUCE_NUM_WARPS = 2", {GUMBEL}),
    "mrv2 constant": (
        "rejection_mrv2/rejection_sample_mrv2_constants.py",
        "GROUP = tl.constexpr(256)", "GROUP = tl.constexpr(128)",
        {MRV2, MRV2F}),
    "temperature kernel code": (
        "sampling/temperature.py",
        "if temp == 0.0 or temp == 1.0:", "if temp == 0.0:", {TEMPERATURE}),
    "min_p launcher code": (
        "sampling/min_p.py", "if splits == 1:", "if splits == 0:", {MIN_P}),
    "threshold search": (
        "_truncation.py", "pivots = tl.minimum(tl.maximum(pivots, lo), hi - 1)",
        "pivots = tl.maximum(tl.minimum(pivots, hi - 1), lo)",
        {TOPK_TOPP, SAMPLE, V1, MRV2, V1F, MRV2F}),
    "fold": (
        "_folding.py", "    x = divide(x, temp, DIV)\n", "    x = divide(x, temp + 0.0, DIV)\n",
        {V1, MRV2, V1F, MRV2F}),
    "launch options": (
        "_launch.py", 'options["waves_per_eu"] = chosen["waves_per_eu"]',
        'options["waves_per_eu"] = chosen["waves_per_eu"] + 0',
        {V1, MRV2, GUMBEL, TEMPERATURE, MIN_P, TOPK_TOPP, SAMPLE, V1F, MRV2F}),
    "fused sampler launcher": (
        "sampling/sample.py", 'BLOCK_V=block, PIVOTS=config["PIVOTS"], USE_FP64=use_fp64',
        'BLOCK_V=block, PIVOTS=config["PIVOTS"], USE_FP64=not use_fp64', {SAMPLE}),
}

# Imports each package copy in turn (torch and triton once) and prints its hashes.
_READ_HASHES = """
import importlib, json, sys
import torch, triton  # noqa: F401
out = {}
for root in sys.argv[1:]:
    for name in [m for m in sys.modules if m == "spectune" or m.startswith("spectune.")]:
        del sys.modules[name]
    sys.path.insert(0, root)
    importlib.invalidate_caches()
    out[root] = importlib.import_module("spectune.kernels").family_hashes()
    sys.path.remove(root)
print(json.dumps(out))
"""


def test_edits_of_a_package_copy(tmp_path: Path) -> None:
    edits = {**_SAME, **{label: edit[:3] for label, edit in _CHANGED.items()}}
    roots = {}
    for label, (file, old, new) in edits.items():
        root = tmp_path / label.replace(" ", "_")
        shutil.copytree(ROOT / "spectune", root / "spectune",
                        ignore=shutil.ignore_patterns("__pycache__", "*.db"))
        path = root / "spectune" / "kernels" / file
        text = path.read_text(encoding="utf-8")
        assert text.count(old) == 1, f"{label}: {old!r} is not once in {file}"
        path.write_text(text.replace(old, new), encoding="utf-8")
        roots[label] = str(root)
    pristine = tmp_path / "pristine"
    shutil.copytree(ROOT / "spectune", pristine / "spectune",
                    ignore=shutil.ignore_patterns("__pycache__", "*.db"))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _READ_HASHES, str(pristine), *roots.values()],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    hashes = json.loads(done.stdout)
    original = hashes[str(pristine)]
    assert original == family_hashes()
    for label in _SAME:
        assert hashes[roots[label]] == original, f"{label} changed a source hash"
    for label, (*_, families) in _CHANGED.items():
        edited = hashes[roots[label]]
        moved = {name for name in original if edited[name] != original[name]}
        assert moved == families, f"{label} changed the hashes of {sorted(moved)}"
    for family in (V1, MRV2, GUMBEL, TEMPERATURE, MIN_P):
        values = [hashes[roots[label]][family] for label, e in _CHANGED.items() if family in e[3]]
        assert len(set(values)) == len(values), f"two edits gave {family} the same hash"


# --------------------------------------------------------------------------------------
# The shipped memo: the hash of the shipped kernels without parsing them
# --------------------------------------------------------------------------------------


def _hashed_modules() -> list[str]:
    return sorted({m for f in FAMILIES.values() for m in f.source_modules})  # type: ignore[attr-defined]


def _text(name: str) -> str:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).read_text(encoding="utf-8")


def test_the_shipped_memo_is_current() -> None:
    memo = json.loads(_code_hash.MEMO_FILE.read_text(encoding="utf-8"))
    assert sorted(memo) == _hashed_modules(), (
        "spectune/data/code_hashes.json is out of date: run python scripts/update_code_hashes.py"
    )
    for name in _hashed_modules():
        source = _text(name)
        assert memo[name] == {
            "text": hashlib.sha256(source.encode()).hexdigest(),
            "code": hashlib.sha256(canonical_code(source).encode()).hexdigest(),
        }, ("spectune/data/code_hashes.json is out of date: run "
            "python scripts/update_code_hashes.py")


def test_the_memo_is_used_only_for_the_recorded_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rejection = "spectune.kernels.rejection.rejection_sample"
    parsed = hashlib.sha256(canonical_code(_text(rejection)).encode()).hexdigest()
    text = hashlib.sha256(_text(rejection).encode()).hexdigest()
    memo = tmp_path / "code_hashes.json"
    monkeypatch.setattr(_code_hash, "MEMO_FILE", memo)
    for recorded_text, expected in ((text, "c0de"), ("an edited kernel", parsed)):
        memo.write_text(json.dumps({rejection: {"text": recorded_text, "code": "c0de"}}))
        _code_hash._memo.cache_clear()
        try:
            assert code_digest(rejection) == expected
        finally:
            _code_hash._memo.cache_clear()
    memo.unlink()  # no memo at all: parsed
    assert code_digest(rejection) == parsed
    _code_hash._memo.cache_clear()
