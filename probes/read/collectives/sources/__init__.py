"""Collective-state sources: every module in this package is one, run by ``read/collectives/collective_feed.py``.

A source module defines ``Source``, a :class:`CollectiveSource` whose ``field`` names the
``ObservedJob`` field its reading fills (``probes/observed.py``). Adding a source is a module
here and that field: the feed finds the module, the live view, ``snapshot``, ``watch``, node
agents and bundles all run it, and the judge combines every ``CollectiveState`` field.

A source reads, never judges: ``fetch`` runs in the feed's background thread and is bounded;
``reading`` returns at once with what was read so far.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from ...processes import procfacts
from ..nccl_state import PIPE_WAIT_S
from ...processes.process import JobProcesses, RankProcess
from ....record import Record


@dataclass(frozen=True, repr=False)
class FeedOptions(Record):
    """How the sources read. ``bundle``: an evidence dump asks everything once and keeps the raw
    evidence (``Reading.files``); ``debug_urls``: rank -> torch.distributed.debug worker URL."""

    hook_timeout: float = 2.0
    pipe_wait: float = PIPE_WAIT_S
    bundle: bool = False
    debug_urls: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True, repr=False)
class Reading(Record):
    """What one source has read: the value of its ``ObservedJob`` field, notes for the job,
    and for bundles the raw evidence (bundle-relative path -> bytes), where it answered
    (source name -> ranks or addresses) and per-rank notes of what it could not get."""

    value: object = None
    notes: tuple[str, ...] = ()
    files: Mapping[str, bytes] = field(default_factory=dict)
    worked: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    rank_notes: Mapping[int, tuple[str, ...]] = field(default_factory=dict)


class RankEnvs:
    """Each rank's environment, read once per PID, over what discovery kept. Thread-safe."""

    def __init__(self) -> None:
        self._known: dict[int, dict[str, str]] = {}
        self._lock = threading.Lock()

    def of(self, proc: RankProcess) -> dict[str, str]:
        with self._lock:
            known = self._known.get(proc.pid)
        if known is None:
            known = {**proc.env, **(procfacts.read_environ(proc.pid) or {})}
            with self._lock:
                self._known[proc.pid] = known
        return known


class CollectiveSource:
    """One collective-state source. Subclasses set ``field`` and override what they need."""

    field: ClassVar[str]
    interval: ClassVar[float] = 0.0  # seconds between two fetches, at least (besides the feed's own)

    def __init__(self, options: FeedOptions, envs: RankEnvs | None = None) -> None:
        self.options = options
        self.envs = envs or RankEnvs()  # the feed's, shared by its sources

    def fetch(self, job: JobProcesses) -> None:
        """Read once, bounded; runs in the feed's background thread."""

    def episode(self, stuck: bool) -> None:
        """Whether some rank is stuck now (a stuck episode may ask a rank once for a dump)."""

    def reading(self, job: JobProcesses) -> Reading:
        """What was read so far, as evidence about ``job``; returns at once."""
        return Reading()

    def wait(self, deadline: float) -> None:
        """Join work of its own still running (a dump being awaited) until ``deadline`` (monotonic)."""

    def close(self) -> None:
        """Stop: work of its own ends at its next check."""

    def env(self, proc: RankProcess) -> dict[str, str]:
        """The rank's environment (:class:`RankEnvs`)."""
        return self.envs.of(proc)


def source_classes() -> list[type[CollectiveSource]]:
    """Every source module's ``Source``, in module-name order."""
    found = []
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        source = getattr(loaded, "Source", None)
        if isinstance(source, type) and issubclass(source, CollectiveSource):
            found.append(source)
    return found
