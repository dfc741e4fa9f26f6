"""The one place that reads collective state: every source in ``read/collectives/sources/``, in the background.

The live view, ``snapshot``, ``watch`` and node agents (through ``live.py``) and evidence
bundles (``evidence/bundle.py``, with ``FeedOptions(bundle=True)``) all read through a
:class:`CollectiveFeed`; :meth:`CollectiveFeed.evidence` gives the ``ObservedJob`` fields.

Nothing here ever blocks a poll: :meth:`CollectiveFeed.refresh` starts a round (each source's
``fetch`` in a thread of its own, bounded) unless one runs; :meth:`CollectiveFeed.evidence`
returns what was read so far. One-shot callers (``snapshot``, bundles) start the feed, do their
own sampling, then :meth:`CollectiveFeed.wait` at most a given number of seconds.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..processes.process import JobProcesses
from .sources import CollectiveSource, FeedOptions, RankEnvs, Reading, source_classes
from ...observed import combine_states
from ...snapshot import CollectiveState
from ...record import Record

MIN_INTERVAL_S = 1.0  # at most one round per second, however often the view polls
ROUND_BOUND_S = 10.0  # a round gives up on a source that has not returned by then


@dataclass(frozen=True, repr=False)
class FeedEvidence(Record):
    """Every source's reading: the ``ObservedJob`` fields, the notes, and for bundles the raw
    files, where each source answered and per-rank notes."""

    fields: dict[str, object]
    notes: tuple[str, ...] = ()
    files: dict[str, bytes] = field(default_factory=dict)
    worked: dict[str, tuple[str, ...]] = field(default_factory=dict)
    rank_notes: dict[int, tuple[str, ...]] = field(default_factory=dict)


class CollectiveFeed:
    """Every collective-state source of one job. ``job`` is the job or a function returning the
    current one (ranks restart under new PIDs). Thread-safe; every method returns at once except
    :meth:`wait`. ``start``: begin the first round now (else at the first :meth:`refresh`)."""

    def __init__(self, job: JobProcesses | Callable[[], JobProcesses], *, options: FeedOptions = FeedOptions(),
                 min_interval: float = MIN_INTERVAL_S,
                 sources: list[type[CollectiveSource]] | None = None, start: bool = True) -> None:
        self._job = job if callable(job) else (lambda: job)
        self._min_interval = min_interval
        envs = RankEnvs()  # one read of each rank's environment for every source
        self._sources = [cls(options, envs) for cls in (sources if sources is not None else source_classes())]
        self._last: dict[str, float] = {}  # source field -> when its last fetch started (monotonic)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._round: threading.Thread | None = None
        self._round_started = float("-inf")
        self._lost: dict[str, str] = {}  # source field -> the last error that cost its reading (shown as a note)
        if start:  # else the first round waits for refresh()
            self.refresh()

    def refresh(self, stuck: bool | None = None) -> None:
        """Start a round in the background unless one runs or one started under ``min_interval``
        ago. ``stuck``: whether some rank is stuck now (a stuck episode may ask each rank's
        debug-info pipe once; it ends when no rank is stuck)."""
        if stuck is not None:
            for source in self._sources:
                source.episode(stuck)
        with self._lock:
            if self._closed.is_set():
                return
            running = self._round is not None and self._round.is_alive()
            if running or time.monotonic() - self._round_started < self._min_interval:
                return
            self._round_started = time.monotonic()
            self._round = threading.Thread(target=self._run_round, name="tw-collective-feed", daemon=True)
            self._round.start()

    def evidence(self, job: JobProcesses | None = None) -> FeedEvidence:
        """What every source has read so far, about ``job`` (default: the feed's job); starts nothing."""
        job = job or self._job()
        readings = {source.field: self._reading(source, job) for source in self._sources}
        notes = [note for reading in readings.values() for note in reading.notes]
        with self._lock:
            notes += [f"collective state from {name} lost: {error}" for name, error in self._lost.items()]
        files: dict[str, bytes] = {}
        worked: dict[str, tuple[str, ...]] = {}
        rank_notes: dict[int, tuple[str, ...]] = {}
        for reading in readings.values():
            files.update(reading.files)
            worked.update(reading.worked)
            for rank, more in reading.rank_notes.items():
                rank_notes[rank] = (*rank_notes.get(rank, ()), *more)
        return FeedEvidence({name: reading.value for name, reading in readings.items()},
                            tuple(dict.fromkeys(notes)), files, worked, rank_notes)

    def state(self) -> CollectiveState | None:
        """Every plain collective state read so far as one (``observed.combine_states``)."""
        values = self.evidence().fields.values()
        return combine_states([value for value in values if isinstance(value, CollectiveState)])

    def latest(self, stuck: bool | None = None) -> CollectiveState | None:
        """:meth:`state`, and a fresh round started."""
        self.refresh(stuck)
        return self.state()

    def wait(self, timeout: float) -> CollectiveState | None:
        """Block at most ``timeout`` seconds for the round in flight and the dumps the sources
        await; then :meth:`state` (for one-shot callers, after their own sampling)."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._lock:
            running = self._round
        if running is not None:
            running.join(max(0.0, deadline - time.monotonic()))
        for source in self._sources:
            source.wait(deadline)
        return self.state()

    def close(self) -> None:
        """Stop: no new round; the sources' own waits end at their next check. Returns at once."""
        self._closed.set()
        for source in self._sources:
            source.close()

    def _run_round(self) -> None:
        """Each source whose interval has passed, in parallel, each bounded."""
        try:
            job = self._job()
        except Exception as exc:  # noqa: BLE001 - the job's getter (rediscovery) must never kill the feed thread
            self._note_lost("the job's processes", exc)
            return
        now = time.monotonic()
        due = [s for s in self._sources if now - self._last.get(s.field, float("-inf")) >= s.interval]
        threads = []
        for source in due:
            self._last[source.field] = now
            threads.append(threading.Thread(target=self._fetch, args=(source, job), name=f"tw-{source.field}",
                                            daemon=True))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(0.0, now + ROUND_BOUND_S - time.monotonic()))


    def _fetch(self, source: CollectiveSource, job: JobProcesses) -> None:
        try:
            source.fetch(job)
        except Exception as exc:  # noqa: BLE001 - a probe bug must not take the feed (or the screen) down: noted instead
            self._note_lost(source.field, exc)
        else:
            with self._lock:
                self._lost.pop(source.field, None)

    def _reading(self, source: CollectiveSource, job: JobProcesses) -> Reading:
        try:
            return source.reading(job)
        except Exception as exc:  # noqa: BLE001 - likewise: a source that cannot say anything says nothing, and why
            self._note_lost(source.field, exc)
            return Reading()

    def _note_lost(self, name: str, exc: Exception) -> None:
        with self._lock:
            self._lost[name] = f"{type(exc).__name__}: {exc}"[:300]


def collect(job: JobProcesses, timeout: float) -> CollectiveState | None:
    """One blocking read of every source, at most ``timeout`` seconds. Callers that sample
    meanwhile use :class:`CollectiveFeed` and ``wait``."""
    feed = CollectiveFeed(job)
    try:
        return feed.wait(timeout)
    finally:
        feed.close()
