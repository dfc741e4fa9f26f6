"""The one contract every snapshot source keeps: a live local job, a multi-node job, a bundle.

Views (the live monitor, ``snapshot``, ``dump``) read a :class:`Source` and close it when done;
whatever opened a source closes it (``evidence.bundle.write_evidence`` dumps one). ``paused_judgement()`` holds the source's progress
judgement while something else samples the ranks (an evidence dump attaches py-spy to every
rank, which wakes their threads: that must not count as progress).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

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
