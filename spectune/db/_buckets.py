"""The batch buckets rows are tuned at, and a batch is looked up at.

Rows are tuned at powers of two and a batch is looked up at the nearest,
``2 ** round(log2(b))`` on a log scale. Integers never fall exactly between two buckets
(that would need ``b = 2**n * sqrt(2)``), so there are no ties: 3 -> 4, 5 -> 4, 6 -> 8,
11 -> 8, 12 -> 16, 22 -> 16, 23 -> 32. There is no largest bucket.

A module of its own, with no imports: the serving path (:mod:`spectune.db._config_index`)
needs the buckets and nothing else of :mod:`spectune.db._row`, whose row classes cost
milliseconds to build at every vLLM worker's start.
"""

from __future__ import annotations

__all__ = ["batch_bucket", "is_batch_bucket"]


def batch_bucket(batch: int) -> int:
    """The bucket a batch of ``batch`` requests is looked up at.

    Args:
        batch: Number of requests, a positive integer.

    Returns:
        The power of two nearest to ``batch`` on a log scale.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    lower = 1 << (batch.bit_length() - 1)
    # b is nearer to lower than to 2*lower on a log scale iff b / lower < 2 * lower / b,
    # i.e. b*b < 2*lower*lower; exact in integers.
    return lower if batch * batch < 2 * lower * lower else 2 * lower


def is_batch_bucket(batch: object) -> bool:
    """Whether ``batch`` is a bucket (a positive power of two)."""
    return (
        isinstance(batch, int)
        and not isinstance(batch, bool)
        and batch > 0
        and batch & (batch - 1) == 0
    )
