"""The one contract every snapshot source keeps: a live local job, a multi-node job, a bundle.

Views (the live monitor, ``snapshot``, ``dump``) read a :class:`Source` and close it when done;
whatever opened a source closes it (``evidence.bundle.write_evidence`` dumps one). ``paused_judgement()`` holds the source's progress
judgement while something else samples the ranks (an evidence dump attaches py-spy to every
rank, which wakes their threads: that must not count as progress).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
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

    def select(self, ranks: frozenset[int]) -> None:
        """The ranks a view shows in detail: a source over other nodes has them send every thread
        and the log tail of those ranks from now on."""
        ...

    def collect_bundles(self, bundle_dir: Path) -> list[str]:
        """Each other node's evidence bundle into ``<bundle_dir>/hosts/<node>/``; one note per node."""
        ...

    def remembered_places(self) -> Mapping[int, frozenset[str]] | None:
        """Where the source's judge saw each rank while running (tie-breaks a bundle keeps); None
        when it keeps no judge across polls."""
        ...


class OneNodeSource:
    """What a source that reaches no other node and keeps no judge provides of :class:`Source`'s
    optional parts: nothing to select, no other node's bundle, no remembered places."""

    def select(self, ranks: frozenset[int]) -> None:
        return None

    def collect_bundles(self, bundle_dir: Path) -> list[str]:
        return []

    def remembered_places(self) -> Mapping[int, frozenset[str]] | None:
        return None
