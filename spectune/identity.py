"""Device and software identity: computed here, used by the tuner, the database and the plugin.

The dataclasses are pure Python so ``spectune.db`` can key rows with them; the
``detect_*`` functions import torch and triton lazily and never create a GPU context
at import time.
"""

from __future__ import annotations

import hashlib
import os
import platform
from dataclasses import asdict, dataclass
from functools import lru_cache

__all__ = [
    "DeviceIdentity",
    "SoftwareIdentity",
    "detect_device",
    "detect_software",
    "source_hash",
    "use_interpreter",
]


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


def vllm_device_name(name: str) -> str:
    """Device name as vLLM spells it in tuned-config file names."""
    return name.strip().replace(" ", "_")


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
        backend="cpu-interpreter",
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
    return DeviceIdentity(
        backend="hip" if is_hip else "cuda",
        arch=arch,
        device_name=vllm_device_name(props.name),
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


def source_hash(*texts: str) -> str:
    """A short, stable hash of kernel source text (part of every tuned row's identity)."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]
