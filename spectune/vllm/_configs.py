"""The plugin's one way to tuned configs: the device, the databases and the kernel registry.

:meth:`TunedConfigs.load` identifies the device (:mod:`spectune.identity`, the one place
that names devices, as ``spectune sweep`` does), reads the databases in their lookup
order (:func:`spectune.db.load_index`: ``SPECTUNE_DB``, the user database, the shipped
one) and keeps the rows usable here for the kernel families a router launches (their
source hashes and search spaces from :mod:`spectune.kernels`; every installed family
when none are named). The databases hand over only those rows: measured on this device,
with this Triton version, of those families at their installed source hashes (an
equality search of the table's unique index); every other row stays unread. A router
then asks :meth:`TunedConfigs.entry` once per shape, and routes the shape only where
the row says spectune's config was faster than the installed vLLM's own function
(:meth:`TunedConfigs.serves`); ``SPECTUNE_FORCE=1`` routes every shape (the row's config,
else the family's default).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from spectune.db import IndexEntry
    from spectune.identity import DeviceIdentity
    from spectune.space import Problem

__all__ = ["NOT_MEASURED", "NO_ROW", "VLLM_FASTER", "EntryLookup", "Lookup", "TunedConfigs"]

#: ``(kernel family, problem) -> config``, or ``None`` where nothing is tuned.
Lookup = Callable[[str, "Problem"], "dict[str, int] | None"]
#: ``(kernel family, problem) -> the row's entry``, or ``None`` where there is no row.
EntryLookup = Callable[[str, "Problem"], "IndexEntry | None"]

#: Why a shape goes to vLLM (counted by :func:`spectune.vllm.passed_calls`).
NO_ROW = "no row"
VLLM_FASTER = "vllm faster here"
NOT_MEASURED = "not measured against vLLM"


class TunedConfigs:
    """The tuned configs usable on one device.

    Plain class, not a dataclass: this module is imported on vLLM's worker start-up
    path, where generating dataclass methods costs milliseconds.

    Attributes:
        device: The device they are usable on.
        lookup: ``(kernel, problem) -> config`` (``None``: nothing tuned for it; the
            family's default config is used).
        entry: ``(kernel, problem) -> IndexEntry`` (``None``: no row): the row's config
            and its verdict against vLLM.
        description: Which databases were read and what each held, for the log line.
        usable: How many configs are usable here (of the families loaded).
        faster: How many of them were measured faster than the installed vLLM's own
            function (under that vLLM version): the shapes routed.
        vllm_version: The installed vLLM's version (``None``: unknown).
        forced: ``SPECTUNE_FORCE=1``: every shape routed, verdicts ignored.
    """

    __slots__ = ("description", "device", "entry", "faster", "forced", "lookup", "usable",
                 "vllm_version")

    def __init__(
        self, *, device: DeviceIdentity, lookup: Lookup, description: str, usable: int,
        entry: EntryLookup | None = None, faster: int = 0, vllm_version: str | None = None,
        forced: bool = False,
    ) -> None:
        self.device = device
        self.lookup = lookup
        self.description = description
        self.usable = usable
        # Without ``entry`` (configs made by hand, not from a database): the lookup's
        # configs, none measured against vLLM (routed only when forced).
        self.entry: EntryLookup = entry or _entries_of(lookup)
        self.faster = faster
        self.vllm_version = vllm_version
        self.forced = forced

    def serves(self, entry: IndexEntry) -> bool:
        """Whether the row's config serves its shape: measured faster than vLLM's own
        function, under the installed vLLM version."""
        return (entry.vs_vllm == "faster" and self.vllm_version is not None
                and entry.vllm_version == self.vllm_version)

    def why_vllm(self, entry: IndexEntry | None) -> str:
        """Why a shape with this row (``None``: none) goes to vLLM."""
        if entry is None:
            return NO_ROW
        if entry.vs_vllm == "not faster" and entry.vllm_version == self.vllm_version:
            return VLLM_FASTER
        # Not measured, or measured under another vLLM (stale: `spectune nightly`
        # measures it again).
        return NOT_MEASURED

    def __repr__(self) -> str:
        return f"TunedConfigs({self.device.device_name}, usable={self.usable})"

    @property
    def backend(self) -> str:
        """Backend of the device (search spaces and default configs depend on it)."""
        return self.device.backend

    def describe(self) -> str:
        """The head of the plugin's log line: device and databases."""
        return f"spectune: device {self.device.describe()}; database: {self.description}"

    @classmethod
    def load(
        cls, device: torch.device | None = None, *, families: Iterable[str] | None = None
    ) -> TunedConfigs:
        """Identify ``device`` and load the configs usable on it. Never raises for a bad
        database (:func:`spectune.db.load_index` logs and skips it).

        Args:
            device: The torch device verification runs on; ``None`` (or a CPU device)
                identifies the current device the way :func:`spectune.identity.detect_device`
                does.
            families: The kernel families to load configs of (a router's
                :attr:`~spectune.vllm._router.SeamRouter.families`): the rows of any other
                family are not read, and lookups of one find nothing. ``None``: every
                installed family.
        """
        from spectune.db import load_index
        from spectune.identity import detect_device, detect_software
        from spectune.kernels import family_hashes, family_space, get_family
        from spectune.vllm._settings import forced

        index_of_gpu = None if device is None or device.type == "cpu" else device.index
        identity = detect_device(index_of_gpu)
        software = detect_software()
        if families is None:
            hashes = family_hashes()
        else:  # only these families' sources are hashed (and, lazily, imported)
            hashes = {name: get_family(name).source_hash for name in families}
        index = load_index(device=identity, software=software, kernel_hashes=hashes,
                           spaces=family_space)

        def lookup(kernel: str, problem: Problem) -> dict[str, int] | None:
            return index.lookup(device=identity, software=software, kernel=kernel,
                                problem=problem)

        def entry(kernel: str, problem: Problem) -> IndexEntry | None:
            return index.entry(device=identity, software=software, kernel=kernel,
                               problem=problem)

        try:
            from spectune.vllm._settings import installed_vllm_version

            vllm_version: str | None = installed_vllm_version()
        except ImportError:
            vllm_version = None
        description = "; ".join(s.describe() for s in index.sources) or "no databases"
        return cls(device=identity, lookup=lookup, description=description,
                   usable=len(index), entry=entry,
                   faster=index.count_faster(vllm_version=vllm_version),
                   vllm_version=vllm_version, forced=forced())


def _entries_of(lookup: Lookup) -> EntryLookup:
    """Index entries of ``lookup``'s configs, none measured against vLLM."""
    from spectune.db import IndexEntry

    def entry(kernel: str, problem: Problem) -> IndexEntry | None:
        config = lookup(kernel, problem)
        return None if config is None else IndexEntry(config, "not measured", None)

    return entry
