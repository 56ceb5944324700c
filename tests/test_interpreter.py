"""The test-only interpreter shortcut (:mod:`tests._interpreter`) changes no result."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from spectune.kernels import get_family
from spectune.space import Problem
from tests._interpreter import installed, restore_patching, skip_repeated_patching

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="only the interpreter is patched")


def test_installed_for_the_session() -> None:
    from triton.runtime import interpreter

    assert installed()
    # Installed by this module or by the copy sitecustomize loaded (xdist workers).
    assert interpreter.InterpretedFunction.__call__.__module__ in (
        "tests._interpreter", "_spectune_test_interpreter")


def test_restoring_puts_triton_own_call_back() -> None:
    from triton.runtime import interpreter

    restore_patching()
    try:
        assert not installed()
        assert interpreter.InterpretedFunction.__call__.__module__ == interpreter.__name__
    finally:
        assert skip_repeated_patching()
    assert installed()


@pytest.mark.parametrize("family_name", ["sample", "rejection_sample_mrv2", "rejection_sample"])
def test_kernels_give_the_same_output_with_and_without_it(family_name: str) -> None:
    family = get_family(family_name)
    problem = Problem(spec_len=3, batch=3, vocab=300)
    inputs = family.make_inputs(problem, seed=7)
    config = family.default_config(problem, "cpu-interpreter")

    def run() -> list[torch.Tensor]:
        out = family.launch(inputs, config)
        return [t.clone() for t in (out if isinstance(out, tuple | list) else (out,))]

    shortcut = run()
    restore_patching()
    try:
        triton_own = run()
    finally:
        assert skip_repeated_patching()
    assert len(shortcut) == len(triton_own)
    for a, b in zip(shortcut, triton_own, strict=True):
        assert torch.equal(a, b)
    assert family.same(family.reference(inputs), family.launch(inputs, config))


def test_installed_in_the_python_processes_tests_start() -> None:
    """Through tests/_site/sitecustomize.py, once Triton's interpreter is imported; a
    process that never imports Triton does not import it for this."""
    probe = ("import sys; assert 'triton' not in sys.modules; "
             "from triton.runtime import interpreter; "
             "print(interpreter.InterpretedFunction.__call__.__module__)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, env=os.environ.copy())
    assert done.stdout.strip() == "_spectune_test_interpreter", done.stderr
