"""What happens when two rows share a key: the promotion rule decides, provenance is kept."""

from __future__ import annotations

from enum import Enum

from spectune.db._row import Provenance, TunedRow
from spectune.promotion import MIN_GAIN, is_significantly_faster

__all__ = ["Outcome", "resolve"]


class Outcome(str, Enum):
    """What recording a row did."""

    INSERTED = "inserted"
    """No row had the key: the row was added."""
    REPLACED = "replaced"
    """The row was significantly faster than the incumbent and replaced it."""
    KEPT = "kept"
    """The incumbent stayed (the row was not significantly faster); its provenance was kept."""
    UNCHANGED = "unchanged"
    """The database already held this measurement: nothing changed."""


def resolve(
    incumbent: TunedRow, candidate: TunedRow, *, min_gain: float = MIN_GAIN
) -> tuple[Outcome, TunedRow]:
    """Decide between two rows of the same key.

    The candidate wins only when :func:`spectune.promotion.is_significantly_faster`
    says so. Either way the winner's ``history`` gains every provenance of both rows
    (their own and their histories) except its own, without duplicates, oldest first.

    Returns:
        The outcome and the row to store (``incumbent`` itself when unchanged).
    """
    if candidate.key != incumbent.key:
        raise ValueError("candidate and incumbent must have the same key")
    faster = is_significantly_faster(candidate.tuned, incumbent.tuned, min_gain=min_gain)
    winner = candidate if faster else incumbent
    seen: dict[object, Provenance] = {}
    for entry in (
        incumbent.provenance,
        *incumbent.history,
        candidate.provenance,
        *candidate.history,
    ):
        seen.setdefault(entry.identity, entry)
    own = winner.provenance.identity
    history = tuple(
        sorted(
            (p for identity, p in seen.items() if identity != own),
            key=lambda p: (p.tuned_at, p.host, p.study),
        )
    )
    merged = winner.replace_history(history)
    if merged == incumbent:
        return Outcome.UNCHANGED, incumbent
    return (Outcome.REPLACED if faster else Outcome.KEPT), merged
