"""Transfer by replay: what one recorded space knows, as a head start on another.

A study on a new GPU starts from the configurations that were fastest for the same
kernel elsewhere. :func:`prior_configs` picks them from a prior recorded space: its
fastest correct configurations that the target space holds, fastest first, which
``replay(prior=...)`` hands to a :class:`~spectune.search.TransferStrategy` (tried on
alternate turns until they stop improving; ``warm_start`` instead evaluates them all
first). A prior from another kernel (other parameters) gives none: it costs nothing.
"""

from __future__ import annotations

from typing import Any

from spectune.search.replay._t4 import RecordedSpace

__all__ = ["prior_configs"]


def prior_configs(prior: RecordedSpace, target: RecordedSpace, *, top: int = 5
                  ) -> list[dict[str, int]]:
    """The ``top`` fastest correct configurations of ``prior`` that ``target`` holds.

    Parameters are matched by name, and values by what the files recorded (through
    each file's ``decode`` for non-integer values).

    Raises:
        ValueError: ``top`` is not a positive integer.
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be a positive integer, got {top!r}")
    names = prior.space.names
    if set(names) != set(target.space.names):
        return []
    ranked = sorted((record.time, key) for key, record in prior.records.items()
                    if record.ok and record.time is not None)
    out: list[dict[str, int]] = []
    for _, key in ranked:
        config = _translate(prior, target, dict(zip(names, key, strict=True)))
        if config is not None and target.key(config) in target.records:
            out.append(config)
            if len(out) == top:
                break
    return out


def _translate(prior: RecordedSpace, target: RecordedSpace, config: dict[str, int]
               ) -> dict[str, int] | None:
    """``config`` of ``prior`` in ``target``'s codes, or ``None`` if a value is unknown."""
    out = {}
    for name, code in config.items():
        value: Any = prior.decode[name][code] if name in prior.decode else code
        if name in target.decode:
            if value not in target.decode[name]:
                return None
            value = target.decode[name].index(value)
        elif not isinstance(value, int):
            return None
        out[name] = int(value)
    return out
