"""Helpers every kernel family's launcher shares: dtype lists and names, tensor checks.

The backend a tensor's device runs kernels on is :func:`spectune.identity.backend_of`
(identity is the one place that names devices).
"""

from __future__ import annotations

import torch

from spectune.space import DTYPES

__all__ = [
    "DTYPE_BY_NAME",
    "INDEX_DTYPES",
    "LOGITS_DTYPES",
    "dtype_name",
    "require_tensor",
]

#: Torch dtype of each logits dtype name a :class:`~spectune.space.Problem` can name.
DTYPE_BY_NAME: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPES}
#: Logits dtypes the kernels read, in the order of :data:`spectune.space.DTYPES`.
LOGITS_DTYPES: tuple[torch.dtype, ...] = tuple(DTYPE_BY_NAME.values())
#: Dtypes accepted for token ids and cumulative counts.
INDEX_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype's name as a :class:`~spectune.space.Problem` spells it (``bfloat16``)."""
    return str(dtype).removeprefix("torch.")


def require_tensor(
    name: str,
    value: object,
    *,
    dtypes: tuple[torch.dtype, ...],
    ndim: int | None = None,
    same_device_as: tuple[str, torch.device] | None = None,
    shape: tuple[int, ...] | None = None,
    rows: bool = False,
) -> None:
    """Check a launcher argument without reading its contents (no device sync).

    Args:
        name: The argument's name, as the error message names it.
        value: The argument.
        dtypes: Allowed dtypes.
        ndim: Required number of dimensions; ``None`` for any.
        same_device_as: ``(name, device)`` of the argument whose device every other
            must share; ``None`` for any device.
        shape: Required shape; ``None`` for any.
        rows: Accept strided rows: only the last dimension must be contiguous (vLLM
            passes row slices of larger buffers).

    Raises:
        ValueError: naming ``name`` and what is wrong with it.
    """
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {list(value.shape)}")
    if value.dtype not in dtypes:
        allowed = ", ".join(dtype_name(d) for d in dtypes)
        raise ValueError(f"{name} must have dtype {allowed}; got {value.dtype}")
    if same_device_as is not None and value.device != same_device_as[1]:
        other, device = same_device_as
        raise ValueError(f"{name} is on {value.device}, {other} on {device}")
    if shape is not None and tuple(value.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(value.shape)}")
    if rows:
        if value.numel() and value.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    elif not value.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
