"""Helpers every kernel family's launcher shares: dtype lists and names, tensor checks.

The backend a tensor's device runs kernels on is :func:`spectune.identity.backend_of`
(identity is the one place that names devices).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import torch

from spectune.kernels._space_parts import dtype_name
from spectune.space import DTYPES

__all__ = [
    "DTYPE_BY_NAME",
    "INDEX_DTYPES",
    "LOGITS_DTYPES",
    "check_state_rows",
    "check_token_ids",
    "require_tensor",
]

#: Torch dtype of each logits dtype name a :class:`~spectune.space.Problem` can name.
DTYPE_BY_NAME: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPES}
#: Logits dtypes the kernels read, in the order of :data:`spectune.space.DTYPES`.
LOGITS_DTYPES: tuple[torch.dtype, ...] = tuple(DTYPE_BY_NAME.values())
#: Dtypes accepted for token ids and cumulative counts.
INDEX_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)


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


def check_state_rows(
    logits: torch.Tensor,
    expanded_idx_mapping: torch.Tensor,
    values: torch.Tensor,
    out: torch.Tensor | None,
    *,
    name: str,
    values_ok: Callable[[torch.Tensor], torch.Tensor],
    rule: str,
    validate: bool,
) -> torch.Tensor:
    """Check the arguments of an in-place step over ``[rows, V]`` logits whose rows read
    a per-request-state float32 value (MRV2's temperature, min-p); returns the tensor
    written (``out``, or ``logits`` in place).

    Args:
        logits: The ``[rows, V]`` logits.
        expanded_idx_mapping: ``[rows]`` request state of each row (``-1``: padded).
        values: ``[max_num_reqs]`` float32, named ``name`` in errors.
        out: Where the result goes instead of ``logits``, or ``None``.
        name: The values' argument name.
        values_ok: Elementwise test of valid values (read only when ``validate``).
        rule: What ``values_ok`` asks, for the error message.
        validate: Also check contents: request states in range, values valid.

    Raises:
        ValueError: naming the offending argument.
    """
    require_tensor("logits", logits, ndim=2, dtypes=LOGITS_DTYPES, rows=True)
    num_tokens, vocab = logits.shape
    on = ("logits", logits.device)
    if vocab < 1:
        raise ValueError("logits: vocab size (dim 1) must be at least 1")
    require_tensor("expanded_idx_mapping", expanded_idx_mapping, ndim=1, dtypes=INDEX_DTYPES,
                   same_device_as=on, shape=(num_tokens,))
    require_tensor(name, values, ndim=1, dtypes=(torch.float32,), same_device_as=on)
    if out is not None:
        require_tensor("out", out, ndim=2, dtypes=(logits.dtype,), same_device_as=on,
                       shape=(num_tokens, vocab), rows=True)
    if validate and num_tokens > 0:
        states = expanded_idx_mapping.to(torch.int64).cpu()
        if bool((states < -1).any()) or bool((states >= values.shape[0]).any()):
            raise ValueError(
                f"expanded_idx_mapping must index {name} (-1 <= state < {values.shape[0]})"
            )
        if not bool(values_ok(values.cpu()).all()):
            raise ValueError(f"{name} must be {rule}")
    return logits if out is None else out


def check_token_ids(
    ids: Mapping[str, torch.Tensor], *, vocab: int, padding: Collection[str] = ()
) -> None:
    """Check token-id arguments' contents: each id in ``[0, vocab)``, or ``-1`` (padding)
    for the arguments named in ``padding``. No other negative id is padding.

    One device sync for all of them (a fused ``any`` of every argument's test); finding the
    first bad id costs more only when there is one. Launchers call it under their
    ``validate`` flag: callers that guarantee their ids (vLLM) skip it and the sync.

    Args:
        ids: The arguments, by name (any shape; indices in a message are flat).
        vocab: The vocabulary size.
        padding: Names of the arguments where ``-1`` marks padding.

    Raises:
        ValueError: naming the first bad argument, the index of its first bad id and
            the id.
    """
    bad = {name: (t < (-1 if name in padding else 0)) | (t >= vocab) for name, t in ids.items()}
    if not bad or not bool(torch.stack([b.any() for b in bad.values()]).any()):
        return
    for name, b in bad.items():
        where = torch.nonzero(b.reshape(-1)).flatten()
        if where.numel():
            i = int(where[0])
            allowed = f"[0, {vocab})" + (" or -1 (padding)" if name in padding else "")
            raise ValueError(
                f"{name}[{i}] = {int(ids[name].reshape(-1)[i])}: token ids must be in {allowed}"
            )
