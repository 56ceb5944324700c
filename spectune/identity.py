"""Device and software identity: computed here, used by the tuner, the database and the plugin.

This is the one place that names devices: the backend of a torch device, the torch
device of a backend, and a GPU's name as vLLM spells it. The dataclasses are pure
Python so ``spectune.db`` can key rows with them; the ``detect_*`` functions import
torch and triton lazily and never create a GPU context at import time.

Device names follow vLLM 0.32 (``current_platform.get_device_name()`` with spaces as
underscores, as in vLLM's tuned-config file names): on ROCm, vLLM names a GPU by its
PCI device id where it knows the id (so an MI300X's virtual function is
``AMD_Instinct_MI300X`` too), else by its marketing name; on CUDA by the driver's name.
``spectune sweep`` and the vLLM plugin both name devices here, so a row tuned on a GPU
is found by the plugin on the same GPU.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

__all__ = [
    "CPU_BACKEND",
    "ROCM_DEVICE_NAMES",
    "DeviceIdentity",
    "SoftwareIdentity",
    "backend_of",
    "detect_device",
    "detect_driver",
    "detect_software",
    "source_hash",
    "torch_device",
    "use_interpreter",
    "vllm_device_name",
]

#: The backend of Triton's interpreter running kernels on CPU tensors.
CPU_BACKEND = "cpu-interpreter"

#: ROCm PCI device id -> device name, as vLLM 0.32 names these GPUs
#: (``vllm/platforms/rocm.py``; a test compares this table with the installed vLLM's).
#: Virtual functions carry the name of their physical GPU.
ROCM_DEVICE_NAMES: dict[int, str] = {
    0x74A0: "AMD_Instinct_MI300A",
    0x74A1: "AMD_Instinct_MI300X",
    0x74B5: "AMD_Instinct_MI300X",  # virtual function
    0x74A2: "AMD_Instinct_MI308X",
    0x74A5: "AMD_Instinct_MI325X",
    0x74B9: "AMD_Instinct_MI325X",  # virtual function
    0x74A9: "AMD_Instinct_MI300X_HF",
    0x74BD: "AMD_Instinct_MI300X_HF",
    0x744C: "AMD_Radeon_RX7900XTX",
    0x150E: "AMD_Radeon_890M",
    0x1586: "AMD_Radeon_8060S",
    0x7550: "AMD_Radeon_RX9070XT",
    0x7551: "AMD_Radeon_R9700",
}


@dataclass(frozen=True)
class DeviceIdentity:
    """What a tuned row was measured on.

    Attributes:
        backend: ``hip``, ``cuda`` or ``cpu-interpreter``.
        arch: ``gfx942``, ``gfx90a``, ``gfx1100``, ``sm_90``; the CPU's machine name
            under the interpreter.
        device_name: vLLM's naming (spaces as underscores): ``AMD_Instinct_MI300X``,
            ``NVIDIA_H200``; ``cpu`` under the interpreter.
        cu_count: Compute units (streaming multiprocessors on NVIDIA).
        warp_size: 64 (CDNA wavefront), 32 (RDNA, NVIDIA); 1 under the interpreter.
    """

    backend: str
    arch: str
    device_name: str
    cu_count: int
    warp_size: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def describe(self) -> str:
        return (
            f"{self.device_name} ({self.backend} {self.arch}, {self.cu_count} CUs, "
            f"warp {self.warp_size})"
        )


@dataclass(frozen=True)
class SoftwareIdentity:
    """Versions a tuned row depends on."""

    triton: str
    torch: str
    runtime: str
    spectune: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def use_interpreter() -> bool:
    """Whether Triton kernels run under the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def vllm_device_name(name: str, *, pci_device_id: int | None = None, hip: bool = False) -> str:
    """A GPU's name as vLLM 0.32 spells it in tuned-config file names.

    Args:
        name: The name the driver reports (``torch.cuda.get_device_name``).
        pci_device_id: The PCI device id, when known.
        hip: Whether the GPU is an AMD GPU under ROCm (named by PCI id where vLLM knows
            it, see :data:`ROCM_DEVICE_NAMES`).
    """
    if hip and pci_device_id is not None and pci_device_id in ROCM_DEVICE_NAMES:
        return ROCM_DEVICE_NAMES[pci_device_id]
    return name.strip().replace(" ", "_")


def backend_of(device: object) -> str:
    """The backend kernels run on for a torch device (or device type string).

    ``cpu`` tensors run under Triton's interpreter (:data:`CPU_BACKEND`); GPU tensors on
    ``hip`` or ``cuda``, whichever this torch build targets.
    """
    device_type = device if isinstance(device, str) else getattr(device, "type", None)
    if device_type == "cpu":
        return CPU_BACKEND
    import torch

    return "hip" if torch.version.hip is not None else "cuda"


def torch_device(backend: str) -> str:
    """The torch device type whose tensors a backend's kernels run on (``cpu``, ``cuda``).

    ROCm builds of torch name AMD GPUs ``cuda`` too.
    """
    return "cpu" if backend == CPU_BACKEND else "cuda"


def detect_device(index: int | None = None) -> DeviceIdentity:
    """Identify the device kernels run on.

    Under ``TRITON_INTERPRET=1``, or without a GPU, this is the CPU interpreter.

    Args:
        index: GPU index; ``None`` means the current device.
    """
    import torch

    if use_interpreter() or not torch.cuda.is_available():
        return _cpu_identity()
    if index is None:
        index = torch.cuda.current_device()
    return _gpu_identity(index)


@lru_cache(maxsize=1)
def _cpu_identity() -> DeviceIdentity:
    return DeviceIdentity(
        backend=CPU_BACKEND,
        arch=platform.machine() or "unknown",
        device_name="cpu",
        cu_count=os.cpu_count() or 1,
        warp_size=1,
    )


@lru_cache(maxsize=16)
def _gpu_identity(index: int) -> DeviceIdentity:
    import torch

    props = torch.cuda.get_device_properties(index)
    is_hip = torch.version.hip is not None
    if is_hip:
        arch = str(getattr(props, "gcnArchName", "gfx")).split(":")[0]
        default_warp = 32 if arch.startswith("gfx1") else 64
    else:
        arch = f"sm_{props.major}{props.minor}"
        default_warp = 32
    pci_device_id = getattr(props, "pci_device_id", None)
    return DeviceIdentity(
        backend="hip" if is_hip else "cuda",
        arch=arch,
        device_name=vllm_device_name(
            props.name,
            pci_device_id=pci_device_id if isinstance(pci_device_id, int) else None,
            hip=is_hip,
        ),
        cu_count=int(props.multi_processor_count),
        warp_size=int(getattr(props, "warp_size", default_warp)),
    )


@lru_cache(maxsize=1)
def detect_software() -> SoftwareIdentity:
    """Versions of triton, torch, the GPU runtime and spectune in this process."""
    import torch
    import triton

    from spectune import __version__

    if torch.version.hip is not None:
        runtime = f"hip-{torch.version.hip}"
    elif torch.version.cuda is not None:
        runtime = f"cuda-{torch.version.cuda}"
    else:
        runtime = "cpu"
    return SoftwareIdentity(
        triton=triton.__version__,
        torch=torch.__version__,
        runtime=runtime,
        spectune=__version__,
    )


#: Where the GPU drivers state their version: NVIDIA's kernel module, AMD's amdgpu.
_DRIVER_FILES = (
    ("nvidia", "/proc/driver/nvidia/version"),
    ("amdgpu", "/sys/module/amdgpu/version"),
)


def detect_driver() -> str:
    """The GPU kernel driver and its version (``nvidia 550.54.15``, ``amdgpu 6.8.5``);
    ``none`` without one (the CPU interpreter). Read from files, not a tool or a device
    context: cheap, and what a driver upgrade changes."""
    for name, path in _DRIVER_FILES:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        match = re.search(r"\b(\d+\.\d+(?:\.\d+)*)\b", text)
        return f"{name} {match.group(1) if match else text.strip()[:64] or 'unknown'}"
    return "none"


def source_hash(*texts: str) -> str:
    """A short, stable hash of kernel source text (part of every tuned row's identity)."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]
