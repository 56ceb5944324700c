"""TunedRow: checked when built, exact round trips, strict parsing of hostile input; buckets."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from spectune.db import VS_VLLM_VERDICTS, Provenance, TunedRow, VllmComparison, batch_bucket
from spectune.db._fields import FIELDS, KEY_FIELDS
from spectune.db._row import is_batch_bucket
from spectune.db.errors import InvalidRowError
from spectune.identity import DeviceIdentity
from spectune.promotion import Timing

from .conftest import T0, make_row


def test_round_trip_through_dict_is_exact() -> None:
    history = (make_row(host="old", p50=12.0, tuned_at=T0 - timedelta(days=3)).provenance,)
    row = make_row(p50=10.123456789, history=history)
    data = row.to_dict()
    assert tuple(data) == FIELDS
    assert TunedRow.from_dict(data) == row
    assert data["speedup"] == pytest.approx(15.0 / 10.123456789)
    assert data["history"][0]["host"] == "old"


def test_key_has_the_key_fields() -> None:
    row = make_row()
    data = row.to_dict()
    assert row.key == tuple(data[name] for name in KEY_FIELDS)
    assert make_row(batch=16).key != row.key
    assert make_row(kernel_hash="ffff").key != row.key
    # Measurements and provenance are not part of the key.
    assert make_row(p50=3.0, host="elsewhere").key == row.key


def test_tuned_at_is_stored_in_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    row = make_row(tuned_at=datetime(2026, 1, 2, 5, 4, 5, tzinfo=plus_two))
    assert row.tuned_at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    assert row.tuned_at.utcoffset() == timedelta(0)


def test_naive_time_is_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        make_row(tuned_at=datetime(2026, 1, 1))


def test_batch_must_be_a_bucket() -> None:
    with pytest.raises(ValueError, match=r"batch_bucket\(48\) = 64"):
        make_row(batch=48)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"BLOCK_V": -64}, "must not be negative"),
        ({"BLOCK_V": 1.5}, "must be an integer"),
        ({"BLOCK_V": True}, "must be an integer"),
        ({"BLOCK_V": "64"}, "must be an integer"),
        ({"BLOCK-V": 64}, "identifier"),
        ({"__import__('os')": 1}, "identifier"),
        ({}, "must not be empty"),
        ({"BLOCK_V": 2**40}, "too large"),
    ],
)
def test_bad_configs(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_row(config=config)


HOSTILE_NAMES = [
    "x'; DROP TABLE tuned_configs; --",
    "../../etc/passwd",
    "a/b",
    "MI300X\n",
    "gfx942\x00",
    "名前",
    "",
    "-flag",
    "A" * 129,
    "dev name",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_device_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="device_name"):
        make_row(
            device=DeviceIdentity(
                backend="hip", arch="gfx942", device_name=name, cu_count=304, warp_size=64
            )
        )


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_kernel_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="kernel"):
        make_row(kernel=name)


@pytest.mark.parametrize(
    "text", ["evil\x1b[31mred", "line\nbreak", "bidi\u202eoverride", "nul\x00", "x" * 257]
)
def test_hostile_host_text_is_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="host"):
        make_row(host=text)


def test_printable_text_with_markup_and_quotes_is_kept() -> None:
    row = make_row(host="[bold]node[/bold] 'a' \"b\" ; --", study="étude / ünïcode")
    assert TunedRow.from_dict(row.to_dict()).host == "[bold]node[/bold] 'a' \"b\" ; --"


def test_unknown_backend_and_bad_counts() -> None:
    with pytest.raises(ValueError, match="backend"):
        make_row(device=DeviceIdentity("rocm", "gfx942", "X", 304, 64))
    with pytest.raises(ValueError, match="cu_count"):
        make_row(device=DeviceIdentity("hip", "gfx942", "X", 0, 64))
    with pytest.raises(ValueError, match="warp_size"):
        make_row(device=DeviceIdentity("hip", "gfx942", "X", 304, -1))
    with pytest.raises(ValueError, match="trials"):
        make_row(trials=-1)
    with pytest.raises(ValueError, match="tuning_seconds"):
        make_row(tuning_seconds=math.nan)


def _edit(**changes: Any) -> dict[str, Any]:
    data = make_row().to_dict()
    data.update(changes)
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_edit(extra=1), "unknown key"),
        ({k: v for k, v in make_row().to_dict().items() if k != "vocab"}, "lacks key"),
        (_edit(speedup=2.0), "speedup"),
        (_edit(tuned_p50_us=math.nan), "tuned timing"),
        (_edit(default_p20_us=99.0), "default timing"),
        (_edit(tuned_at="yesterday"), "ISO 8601"),
        (_edit(tuned_at="2026-01-01T00:00:00"), "UTC offset"),
        (_edit(cu_count="304"), "cu_count"),
        (_edit(spec_len=0), "spec_len"),
        (_edit(dtype="float8"), "dtype"),
        (_edit(draft_probs="yes"), "draft_probs"),
        (_edit(history={"a": 1}), "history"),
        (_edit(history=[{"host": "x"}]), "history entry"),
        (_edit(config=[["BLOCK_V", 64]]), "config"),
        ([1, 2, 3], "must be an object"),
    ],
)
def test_from_dict_is_strict(data: Any, message: str) -> None:
    with pytest.raises(InvalidRowError, match=message):
        TunedRow.from_dict(data)


def test_provenance_round_trip_and_identity() -> None:
    entry = Provenance(
        host="h",
        study="s",
        tuned_at=T0,
        trials=3,
        tuning_seconds=1.5,
        config={"BLOCK_V": 512},
        tuned=Timing(1.0, 2.0, 3.0),
    )
    assert Provenance.from_dict(entry.to_dict()) == entry
    assert entry.identity == ("h", "s", T0)
    assert make_row(host="h", study="s").provenance.identity == entry.identity


# -- batch buckets: the nearest power of two on a log scale ---------------------------


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


def test_a_row_is_not_compared_with_vllm_unless_told() -> None:
    row = make_row()
    assert row.vllm == VllmComparison() == VllmComparison("not measured", None, None, None)
    assert row.vs_vllm_ratio is None
    data = row.to_dict()
    assert (data["vs_vllm"], data["vllm_p50_us"], data["vllm_version"], data["vllm_reason"]) \
        == ("not measured", None, None, None)
    assert VS_VLLM_VERDICTS == ("faster", "not faster", "not measured")


def test_comparison_round_trip_and_ratio() -> None:
    row = make_row(p50=10.0, vllm=VllmComparison("faster", 15, "0.32.0"))
    assert row.vllm.p50_us == 15.0 and isinstance(row.vllm.p50_us, float)
    assert row.vs_vllm_ratio == 1.5
    assert TunedRow.from_dict(row.to_dict()) == row
    slower = make_row(p50=10.0, vllm=VllmComparison("not faster", 8.0, "0.33.0rc1+cu128"))
    assert slower.vs_vllm_ratio == 0.8
    # An older row's dict (no comparison keys) reads as not measured.
    old = {k: v for k, v in row.to_dict().items() if not k.startswith(("vs_vllm", "vllm_"))}
    assert TunedRow.from_dict(old) == row.replace_vllm(VllmComparison())


def test_peak_memory_rides_with_a_measured_comparison() -> None:
    # Measured on a GPU: each side's peak device memory of one call, MiB (zero allowed:
    # a call may allocate nothing).
    measured = VllmComparison("faster", 15, "0.32.0", peak_mib=3, tuned_peak_mib=0.0)
    assert measured.peak_mib == 3.0 and isinstance(measured.peak_mib, float)
    row = make_row(vllm=measured)
    data = row.to_dict()
    assert (data["vllm_peak_mib"], data["tuned_peak_mib"]) == (3.0, 0.0)
    assert TunedRow.from_dict(data) == row
    # Under the CPU interpreter there is no device memory: None, a measured verdict still.
    cpu = VllmComparison("not faster", 8.0, "0.32.0")
    assert (cpu.peak_mib, cpu.tuned_peak_mib) == (None, None)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"peak_mib": 1.0}, "vllm_peak_mib and tuned_peak_mib must be None"),
        ({"tuned_peak_mib": 1.0, "version": "0.32.0"}, "must be None when vs_vllm is"),
        ({"verdict": "faster", "p50_us": 1.0, "version": "0.32.0", "peak_mib": -1.0},
         "vllm_peak_mib must be finite and non-negative"),
        ({"verdict": "faster", "p50_us": 1.0, "version": "0.32.0", "tuned_peak_mib": math.nan},
         "tuned_peak_mib must be finite and non-negative"),
        ({"verdict": "faster", "p50_us": 1.0, "version": "0.32.0", "peak_mib": "3"},
         "vllm_peak_mib must be a number"),
    ],
)
def test_bad_peak_memory(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VllmComparison(**arguments)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"verdict": "slower"}, "vs_vllm must be one of"),
        ({"verdict": None}, "vs_vllm must be one of"),
        ({"verdict": "faster"}, "must be set when vs_vllm is 'faster'"),
        ({"verdict": "faster", "p50_us": 1.0}, "vllm_version must be set"),
        ({"verdict": "not faster", "version": "0.32.0"}, "vllm_p50_us and vllm_version"),
        ({"p50_us": 3.0}, "vllm_p50_us must be None when vs_vllm is 'not measured'"),
        ({"verdict": "faster", "p50_us": 0.0, "version": "0.32.0"}, "finite and positive"),
        ({"verdict": "faster", "p50_us": math.inf, "version": "0.32.0"}, "finite and positive"),
        ({"verdict": "faster", "p50_us": True, "version": "0.32.0"}, "must be a number"),
        ({"verdict": "faster", "p50_us": 1.0, "version": "0.32/../x"}, "vllm_version must be"),
        ({"verdict": "faster", "p50_us": 1.0, "version": "0.32.0", "reason": "why"},
         "vllm_reason must be None"),
        ({"reason": "  "}, "vllm_reason must be non-empty text"),
        ({"reason": 3}, "vllm_reason must be non-empty text"),
    ],
)
def test_bad_comparisons(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        VllmComparison(**arguments)
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="vllm must be a VllmComparison"):
        make_row(vllm="faster")


def test_a_reason_is_kept_as_one_short_printable_line() -> None:
    raised = VllmComparison(version="0.32.0", reason="vLLM's function raised: boom\n  at x\x1b")
    assert raised.reason == "vLLM's function raised: boom"
    long = VllmComparison(reason="x\u202e" * 400)
    assert long.reason is not None and len(long.reason) == 256 and long.reason.isprintable()
    assert make_row(vllm=long).to_dict()["vllm_reason"] == long.reason
