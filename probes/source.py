"""The one contract every snapshot source keeps: a live local job, a multi-node job, a bundle.

Views (the live monitor, ``snapshot``, ``dump``) read a :class:`Source` and close it when done;
whatever opened a source closes it. ``paused_judgement()`` holds the source's progress
judgement while something else samples the ranks (an evidence dump attaches py-spy to every
rank, which wakes their threads: that must not count as progress).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .evidence.bundle import write_bundle
from .snapshot import Snapshot


@runtime_checkable
class Source(Protocol):
    """What a view reads. ``native_for``: global rank numbers whose native stacks are wanted."""

    def poll(self, native_for: frozenset[int] = frozenset()) -> Snapshot:
        """A fresh snapshot (sources without fresh data return their last one)."""
        ...

    def close(self) -> None:
        """Release everything: threads, probes, remote calls still running. Idempotent."""
        ...

    def paused_judgement(self) -> AbstractContextManager[None]:
        """While inside, sampling by others does not count as the ranks' progress."""
        ...


def write_evidence(source: Source, snapshot: Snapshot, out_dir: Path, **options: Any) -> Path:
    """Write an evidence bundle about ``snapshot``'s job into ``out_dir`` while ``source`` holds
    its judgement; returns the bundle's path (``write_bundle`` names it)."""
    with source.paused_judgement():
        return write_bundle(snapshot.job.pid, snapshot, out_dir, **options)
