"""Validators: a row is used only where it was measured, with a config of the space."""

from __future__ import annotations

from dataclasses import replace

import pytest

from spectune.db._checks import check_configs, check_row
from spectune.db.errors import InvalidRowError

from .conftest import CONFIG, H200, KERNEL, KERNEL_HASH, MI300X, SOFTWARE, SPACE, make_row

HASHES = {KERNEL: KERNEL_HASH}


def verdict(row, **overrides):  # type: ignore[no-untyped-def]
    arguments = {"device": MI300X, "software": SOFTWARE, "kernel_hashes": HASHES,
                 "spaces": {KERNEL: SPACE}} | overrides  # fmt: skip
    return check_row(row, **arguments)


def test_matching_row_is_usable() -> None:
    result = verdict(make_row())
    assert result.usable
    assert result.reasons == ()
    assert result.describe() == "usable"


def test_other_device_is_named_field_by_field() -> None:
    result = verdict(make_row(device=H200, config={"BLOCK_V": 1024, "num_warps": 4}))
    assert not result.usable
    (reason,) = result.reasons
    assert "backend 'cuda' (here 'hip')" in reason
    assert "device_name 'NVIDIA_H200' (here 'AMD_Instinct_MI300X')" in reason


def test_cu_count_alone_matters() -> None:
    partition = replace(MI300X, cu_count=38)
    result = verdict(make_row(device=partition))
    assert result.reasons == ("measured on another device: cu_count 38 (here 304)",)


def test_triton_version_and_kernel_hash() -> None:
    result = verdict(make_row(software=replace(SOFTWARE, triton="3.1.0"), kernel_hash="beef"))
    assert result.reasons == (
        "triton 3.1.0 (here 3.2.0)",
        f"kernel source hash beef (here {KERNEL_HASH})",
    )


def test_torch_and_runtime_versions_are_not_checked() -> None:
    assert verdict(make_row(software=replace(SOFTWARE, torch="9.0", runtime="hip-7"))).usable


def test_unknown_kernel_family() -> None:
    result = verdict(make_row(kernel="other"), spaces={KERNEL: SPACE})
    assert result.reasons == (
        "kernel family 'other' is not installed here",
        "no search space for kernel family 'other' on hip",
    )


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"BLOCK_V": 1024, "num_warps": 4, "waves_per_eu": 1, "extra": 1}, "unknown config key"),
        ({"BLOCK_V": 1000, "num_warps": 4, "waves_per_eu": 1}, "power of two"),
        ({"BLOCK_V": 4096, "num_warps": 4, "waves_per_eu": 1}, "is not one of"),
        ({"BLOCK_V": 256, "num_warps": 8, "waves_per_eu": 1}, "violates"),
        ({"BLOCK_V": 1024, "num_warps": 4}, "missing config key"),
    ],
)
def test_config_outside_the_space(config: dict[str, int], message: str) -> None:
    result = verdict(make_row(config=config))
    assert not result.usable
    (reason,) = result.reasons
    assert reason.startswith("config not in the search space")
    assert message in reason


def test_space_applies_per_backend() -> None:
    # waves_per_eu is HIP-only: a CUDA row carrying it is invalid on CUDA.
    cuda_row = make_row(device=H200, config=CONFIG)
    result = verdict(cuda_row, device=H200)
    assert result.reasons == (
        "config not in the search space: unknown config key(s) ['waves_per_eu']; "
        "known: ['BLOCK_V', 'num_warps']",
    )


def test_spaces_as_a_callable_and_none() -> None:
    seen = []

    def lookup(kernel: str, backend: str):  # type: ignore[no-untyped-def]
        seen.append((kernel, backend))
        return SPACE.for_backend(backend)

    assert verdict(make_row(), spaces=lookup).usable
    assert seen == [(KERNEL, "hip")]
    # Without spaces only the shape is checked: a non-power-of-two tile passes.
    assert verdict(make_row(config={"BLOCK_V": 1000}), spaces=None).usable
    with pytest.raises(TypeError, match="spaces"):
        verdict(make_row(), spaces=42)


def test_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="row"):
        check_row({}, device=MI300X, software=SOFTWARE, kernel_hashes=HASHES)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="device"):
        check_row(make_row(), device="MI300X", software=SOFTWARE, kernel_hashes=HASHES)  # type: ignore[arg-type]


def test_check_configs_without_spaces_checks_nothing() -> None:
    check_configs([make_row(config={"BLOCK_V": 3})], spaces=None, where="x")
    with pytest.raises(InvalidRowError, match="x: row 1"):
        check_configs([make_row(config={"BLOCK_V": 3})], spaces={KERNEL: SPACE}, where="x")


# The loader's fast test of stored configs gives the full checks' verdicts: every
# config a fast test accepts, the full checks accept (and return as they would), and
# everything else is decided by the full checks themselves.
STORED_CONFIGS = [
    '{"BLOCK_V": 1024, "num_warps": 4, "waves_per_eu": 1}',  # usable
    '{"waves_per_eu": 0, "num_warps": 1, "BLOCK_V": 256}',  # usable, other key order
    ' {"BLOCK_V": 1024, "num_warps": 4, "waves_per_eu": 1}\n',  # white space: usable
    '\ufeff{"BLOCK_V": 1024, "num_warps": 4, "waves_per_eu": 1}',  # a BOM: not JSON
    '{"BLOCK_V": 1024, "num_warps": 4, "waves_per_eu": 1} x',  # extra data
    '{"BLOCK_V": 1024, "num_warps": 4}',  # a key missing: unusable
    '{"BLOCK_V": 1024, "num_warps": 4, "waves_per_eu": 1, "x": 1}',  # a key more
    '{"BLOCK_V": 1024, "num_warps": 4, "waves_per_eu": 1, "BLOCK_V": 512}',  # repeated key
    '{"BLOCK_V": 1024, "num_warps": 4, "waves_per_eu": true}',  # a bool: malformed
    '{"BLOCK_V": 1024.0, "num_warps": 4, "waves_per_eu": 1}',  # a float: malformed
    '{"BLOCK_V": -1024, "num_warps": 4, "waves_per_eu": 1}',  # negative: malformed
    '{"BLOCK_V": 4294967296, "num_warps": 4, "waves_per_eu": 1}',  # too large
    '{"BLOCK_V": 1000, "num_warps": 4, "waves_per_eu": 1}',  # not a power of two
    '{"BLOCK_V": 4096, "num_warps": 4, "waves_per_eu": 1}',  # not declared
    '{"BLOCK_V": 256, "num_warps": 8, "waves_per_eu": 1}',  # violates the constraint
    '{"BLOCK_V": NaN, "num_warps": 4, "waves_per_eu": 1}',  # NaN: malformed
    '{"bad key": 1}', '{}', "[]", "[1, 2]", '"text"', "1024", "null", "", "{", "}",
    '{"BLOCK_V": 1024,', b'{"BLOCK_V": 1024, "num_warps": 4, "waves_per_eu": 1}',
    b"\xff\x00\x9c", None, 7,
]


@pytest.mark.parametrize("backend_device", [MI300X, H200], ids=["hip", "cuda"])
def test_fast_config_verdicts_are_the_full_checks(backend_device: object) -> None:
    from spectune.db._checks import Checker

    def checker() -> Checker:
        return Checker(device=backend_device, software=SOFTWARE,  # type: ignore[arg-type]
                       kernel_hashes=HASHES, spaces={KERNEL: SPACE})

    fast = checker().stored_configs(KERNEL, STORED_CONFIGS)
    full = checker()
    for stored in STORED_CONFIGS:
        expected = full._stored_verdict(KERNEL, stored)
        assert fast[stored] == expected, stored
        if expected[0] is not None:  # the config as the full checks return it, key order too
            assert list(fast[stored][0]) == list(expected[0]), stored  # type: ignore[arg-type]
    # On HIP the first three, the repeated key (the last one counts) and the bytes (JSON
    # too); on CUDA, whose space has no waves_per_eu, the one without it.
    assert sum(config is not None for config, _ in fast.values()) == (
        5 if backend_device is MI300X else 1)
