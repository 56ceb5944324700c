"""spectune: tuned Triton kernels for speculative-decoding verification in vLLM."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
