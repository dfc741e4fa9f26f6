"""The one place that fetches Flight Recorder traces: for the live view (each rank's, in the
background) and for bundles (:func:`from_hook`, :func:`found_trace`, used by ``evidence/bundle_rank.py``).

Sources per rank; the trace that counts is chosen by ``flightrec.fresher`` (as in bundles):

* the armed hook's ``fr_trace`` over its control socket (bounded, ~13 ms for 550 NCCL entries);
* Flight Recorder dumps already on disk (:func:`nccl_state.fr_files_on_disk`), newer than the job;
* the NCCL debug-info pipe, for a rank the hook cannot answer for: triggered at most once per
  stuck episode, its file then awaited for up to ``PIPE_WAIT_S`` in a thread of its own;
* NCCL RAS (:mod:`.ras`): the job's whole view, at most every ``RAS_INTERVAL_S``; kept raw
  (:meth:`CollectiveFeed.ras_recent`) for the live source to judge across polls.

Nothing here ever blocks a poll: :meth:`CollectiveFeed.latest` returns what the last fetch
found and starts the next one. One-shot callers (``snapshot``) start the feed, do their own
sampling, then :meth:`CollectiveFeed.wait` at most a given number of seconds.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import flightrec
from . import hookclient, nccl_state, procfacts, ras
from .process import JobProcesses, RankProcess
from ..snapshot import CollectiveState

HOOK_TIMEOUT_S = 2.0
MIN_INTERVAL_S = 1.0  # at most one fetch per second, however often the view polls
PIPE_WAIT_S = nccl_state.PIPE_WAIT_S
RAS_INTERVAL_S = 2.0  # RAS gathers from every process of the job: not more often than this


class CollectiveFeed:
    """Each rank's latest Flight Recorder trace, analysed across ranks.

    ``job`` is the job or a function returning the current one (ranks restart under new PIDs).
    Thread-safe; every method returns at once except :meth:`wait`.
    """

    def __init__(self, job: JobProcesses | Callable[[], JobProcesses], *, hook_timeout: float = HOOK_TIMEOUT_S,
                 pipe_wait: float = PIPE_WAIT_S, min_interval: float = MIN_INTERVAL_S) -> None:
        self._job = job if callable(job) else (lambda: job)
        self._hook_timeout, self._pipe_wait, self._min_interval = hook_timeout, pipe_wait, min_interval
        self._lock = threading.Lock()  # guards the fields below; never held while fetching
        self._analysis = threading.Lock()  # one analysis at a time, so the newest traces win
        self._closed = threading.Event()
        self._traces: dict[int, flightrec.FoundTrace] = {}
        self._state: CollectiveState | None = None
        self._fetch: threading.Thread | None = None
        self._fetch_started = float("-inf")
        self._stuck = False
        self._piped: set[int] = set()  # ranks whose pipe was triggered in this stuck episode
        self._pipes: list[threading.Thread] = []
        self._awaiting: set[int] = set()  # ranks whose pipe dump is being awaited
        self._seen_files: dict[str, tuple[float, int]] = {}  # path -> (mtime, size) already read
        self._envs: dict[int, dict[str, str]] = {}
        self._ras: tuple[tuple[ras.RasReply, float], ...] = ()  # recent replies and when asked, oldest first
        self._ras_started = float("-inf")
        self.refresh()

    # -- the interface -------------------------------------------------------------------
    def refresh(self, stuck: bool | None = None) -> None:
        """Start a fetch in the background unless one runs or one started under
        ``min_interval`` ago. ``stuck``: whether some rank is stuck now; a stuck episode may
        trigger each rank's debug-info pipe once, and ends when no rank is stuck."""
        with self._lock:
            if self._closed.is_set():
                return
            if stuck is not None:
                if self._stuck and not stuck:
                    self._piped.clear()  # the episode is over: the next one may ask again
                self._stuck = stuck
            running = self._fetch is not None and self._fetch.is_alive()
            if running or time.monotonic() - self._fetch_started < self._min_interval:
                return
            self._fetch_started = time.monotonic()
            self._fetch = _thread(self._fetch_all, name="tw-collective-feed")
            self._fetch.start()

    def state(self) -> CollectiveState | None:
        """The state from the traces fetched so far (None before any); starts nothing."""
        with self._lock:
            return self._state

    def latest(self, stuck: bool | None = None) -> CollectiveState | None:
        """The state from the traces fetched so far (None before any), and a fresh fetch started."""
        self.refresh(stuck)
        return self.state()

    def wait(self, timeout: float) -> CollectiveState | None:
        """Block at most ``timeout`` seconds for the fetch in flight and the pipe dumps awaited;
        then the state (for one-shot callers, after their own sampling)."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._lock:
            threads = [t for t in (self._fetch, *self._pipes) if t is not None]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            threads = list(self._pipes)  # pipes the fetch has just triggered
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            return self._state

    def ras_recent(self) -> tuple[tuple[ras.RasReply, float], ...]:
        """NCCL RAS's last two replies, oldest first, each with the unix time it was asked for (a
        one-shot caller's first look and its second)."""
        with self._lock:
            return self._ras

    def close(self) -> None:
        """Stop: no new fetch, pipe waits end at their next check. Returns at once."""
        self._closed.set()

    # -- fetching ------------------------------------------------------------------------
    def _fetch_all(self) -> None:
        """One round over every rank, in parallel, each bounded; then one analysis."""
        try:
            job = self._job()
        except Exception:  # the job's getter must never kill the feed thread
            return
        sockets = hookclient.armed_ranks(Path(job.run_dir)) if job.run_dir else {}
        since = job.started_at or 0.0
        ranks = [p for p in job.ranks if p.rank is not None]
        threads = [_thread(self._fetch_rank, p, sockets.get(p.rank), since, name="tw-collective-rank")
                   for p in ranks]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + self._hook_timeout + 1.0
        self._fetch_ras(ranks)  # meanwhile, in this thread
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._analyse()

    def _fetch_ras(self, ranks: list[RankProcess]) -> None:
        """One bounded RAS query at the address the ranks name, unless one ran recently or RAS is off."""
        if not ranks or time.monotonic() - self._ras_started < RAS_INTERVAL_S:
            return
        self._ras_started = time.monotonic()
        env = self._env(ranks[0])
        if ras.disabled(env):
            return
        at = time.time()
        reply = ras.query(*ras.address(env))
        with self._lock:
            self._ras = (*self._ras, (reply, at))[-2:]

    def _fetch_rank(self, proc: RankProcess, sock: Path | None, since: float) -> None:
        rank = proc.rank
        assert rank is not None
        from_hook = self._from_hook(sock) if sock is not None else None
        if from_hook is not None:
            self._store(rank, from_hook)
            return
        env = self._env(proc)
        with self._lock:
            if rank in self._awaiting:
                return  # the file being written is the pipe's: its waiter reads it
        for prefix in nccl_state.fr_prefixes(env):
            trace = self._read_dump(Path(f"{prefix}{rank}"), since)
            if trace is not None:
                self._store(rank, trace)
        self._maybe_pipe(rank, env)

    def _from_hook(self, sock: Path) -> flightrec.FoundTrace | None:
        return from_hook(sock, self._hook_timeout).found

    def _read_dump(self, path: Path, since: float = 0.0, source: str = "flight-recorder-file",
                   again: bool = False) -> flightrec.FoundTrace | None:
        """A dump file's trace when it is newer than ``since``, once per version of the file
        (an unchanged file is not read again unless ``again``)."""
        try:
            info = os.stat(path)
            key = (info.st_mtime, info.st_size)
            if info.st_mtime < since:
                return None
            with self._lock:
                if self._seen_files.get(str(path)) == key and not again:
                    return None
            found = found_trace(nccl_state.read_capped(path), source, info.st_mtime)
        except (OSError, flightrec.TraceError):
            return None  # gone, unreadable, or half written: read again next time
        with self._lock:
            self._seen_files[str(path)] = key
        return found

    def _maybe_pipe(self, rank: int, env: dict[str, str]) -> None:
        """Trigger the rank's debug-info pipe once per stuck episode; await its file elsewhere."""
        if nccl_state.pipe_path(rank, env) is None:
            return
        with self._lock:
            if not self._stuck or rank in self._piped or self._closed.is_set():
                return
            self._piped.add(rank)
            self._awaiting.add(rank)
            thread = _thread(self._await_pipe, rank, env, name="tw-collective-pipe")
            self._pipes = [t for t in self._pipes if t.is_alive()] + [thread]
        thread.start()

    def _await_pipe(self, rank: int, env: dict[str, str]) -> None:
        trace = None
        try:
            found = nccl_state.dump_through_pipe(rank, env, wait_s=self._pipe_wait, stop=self._closed,
                                                 accept=flightrec.is_trace)
            trace = self._read_dump(Path(found.origin), source="pipe", again=True) if found.data else None
            if trace is not None:
                self._store(rank, trace)
        finally:
            with self._lock:
                self._awaiting.discard(rank)
        if trace is not None:
            self._analyse()

    def _env(self, proc: RankProcess) -> dict[str, str]:
        """The rank's environment (read once per PID), over what discovery kept."""
        with self._lock:
            known = self._envs.get(proc.pid)
        if known is None:
            known = {**proc.env, **(procfacts.read_environ(proc.pid) or {})}
            with self._lock:
                self._envs[proc.pid] = known
        return known

    # -- state ---------------------------------------------------------------------------
    def _store(self, rank: int, new: flightrec.FoundTrace) -> None:
        """Keep the trace of a rank that counts (``flightrec.fresher``)."""
        with self._lock:
            self._traces[rank] = flightrec.fresher(self._traces.get(rank), new)

    def _analyse(self) -> None:
        with self._analysis:
            with self._lock:
                traces = dict(self._traces)
            if not traces:
                return
            source = "+".join(sorted({t.source for t in traces.values()}))
            state = flightrec.analyze({rank: t.trace for rank, t in traces.items()}, source=source)
            with self._lock:
                self._state = state


@dataclass(frozen=True)
class HookTraces:
    """What a rank's armed hook answered to ``fr_trace``: each recorder's trace as torch dumped it,
    the merged trace that counts (None: nothing recorded), and why there is none."""

    traces: tuple[tuple[str, dict], ...] = ()
    found: flightrec.FoundTrace | None = None
    error: str | None = None
    notes: tuple[str, ...] = ()


def from_hook(sock: Path, timeout: float) -> HookTraces:
    """Fetch a rank's Flight Recorder through its hook's control socket (bounded)."""
    at = time.time()
    reply = hookclient.request(sock, "fr_trace", timeout=timeout)
    if not reply.ok:
        return HookTraces(error=reply.error)
    try:
        traces, notes = flightrec.hook_reply_traces(reply.text)
    except flightrec.TraceError as exc:
        return HookTraces(error=str(exc))
    merged = flightrec.merge_traces([trace for _, trace in traces])
    found = flightrec.FoundTrace(merged, "hook", at) if merged is not None else None
    return HookTraces(tuple(traces), found, None, tuple(notes))


def found_trace(data: bytes, source: str, at: float) -> flightrec.FoundTrace | None:
    """A dump's bytes as a trace current at ``at``; None when it holds no entry. Raises
    ``flightrec.TraceError`` for bytes that are no trace."""
    trace = flightrec.load_trace(data)
    return flightrec.FoundTrace(trace, source, at) if flightrec.has_entries(trace) else None


def _thread(target: Callable[..., None], *args: object, name: str) -> threading.Thread:
    """A daemon thread that swallows a probe bug instead of printing a traceback over the TUI."""
    def run() -> None:
        try:
            target(*args)
        except Exception:  # a damaged trace or record must not take the feed (or the screen) down
            pass

    return threading.Thread(target=run, name=name, daemon=True)


def collect(job: JobProcesses, timeout: float) -> CollectiveState | None:
    """One blocking fetch of every rank's Flight Recorder (hook and dumps on disk), at most
    ``timeout`` seconds. Callers that sample meanwhile use :class:`CollectiveFeed` and ``wait``."""
    feed = CollectiveFeed(job)
    try:
        return feed.wait(timeout)
    finally:
        feed.close()
