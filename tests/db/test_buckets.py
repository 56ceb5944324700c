"""Batch buckets: the nearest power of two on a log scale."""

from __future__ import annotations

import math

import pytest

from spectune.db import batch_bucket, is_batch_bucket


@pytest.mark.parametrize(
    ("batch", "bucket"),
    [(1, 1), (2, 2), (3, 4), (4, 4), (5, 4), (6, 8), (8, 8), (11, 8), (12, 16), (22, 16),
     (23, 32), (24, 32), (45, 32), (46, 64), (1000, 1024), (1448, 1024), (1449, 2048)],
)  # fmt: skip
def test_documented_values(batch: int, bucket: int) -> None:
    assert batch_bucket(batch) == bucket


def test_nearest_on_log_scale_without_ties() -> None:
    for batch in range(1, 20_000):
        bucket = batch_bucket(batch)
        assert is_batch_bucket(bucket)
        distance = abs(math.log2(batch) - math.log2(bucket))
        for other in (bucket // 2, bucket * 2):
            if other >= 1:
                assert distance < abs(math.log2(batch) - math.log2(other)), batch


@pytest.mark.parametrize("bad", [0, -4, 2.0, True, "8", None])
def test_rejects_non_positive_integers(bad: object) -> None:
    with pytest.raises(ValueError, match="batch"):
        batch_bucket(bad)  # type: ignore[arg-type]


def test_is_batch_bucket() -> None:
    assert [b for b in range(0, 70) if is_batch_bucket(b)] == [1, 2, 4, 8, 16, 32, 64]
    assert not is_batch_bucket(True)
    assert not is_batch_bucket(8.0)
