"""PyTorch's Flight Recorder: each rank's trace, the one that counts chosen by ``flightrec.fresher``.

Where a rank's trace comes from:

* the armed hook's ``fr_trace`` over its control socket (bounded, ~13 ms for 550 NCCL entries);
* Flight Recorder dumps already on disk (``nccl_state.fr_prefixes``), newer than the job;
* the NCCL debug-info pipe, for a rank the hook cannot answer for: triggered at most once per
  stuck episode (bundles: once), its file then awaited for up to ``pipe_wait`` in a thread of
  its own;
* bundles only: each rank's torch.distributed.debug server (``fr_trace_json``).

Each rank's trace is read into its record of its collectives (``flightrec.read_rows``), the ``collectives`` field.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import CollectiveSource, FeedOptions, RankEnvs, Reading
from .. import flightrec, hookclient, nccl_state
from ...processes.process import JobProcesses, RankProcess
from ....snapshot import CollectiveState
from ....record import Record


class Source(CollectiveSource):
    field = "collectives"

    def __init__(self, options: FeedOptions, envs: RankEnvs | None = None) -> None:
        super().__init__(options, envs)
        self._lock = threading.Lock()  # guards the fields below; never held while fetching
        self._analysis = threading.Lock()  # one analysis at a time, so the newest traces win
        self._closed = threading.Event()
        self._traces: dict[int, flightrec.FoundTrace] = {}
        self._state: CollectiveState | None = None
        self._stuck = options.bundle  # a bundle asks every rank's pipe once
        self._piped: set[int] = set()  # ranks whose pipe was triggered in this stuck episode
        self._pipes: list[threading.Thread] = []
        self._awaiting: set[int] = set()  # ranks whose pipe dump is being awaited
        self._seen_files: dict[str, tuple[float, int]] = {}  # path -> (mtime, size) already read
        self._files: dict[str, bytes] = {}  # bundles: raw traces by bundle path
        self._notes: dict[int, list[str]] = {}  # bundles: per rank, what could not be had
        self._failed: dict[int, str] = {}  # rank -> why its last read failed (a probe bug), said as a note

    # -- the source interface --------------------------------------------------------------
    def episode(self, stuck: bool) -> None:
        with self._lock:
            if self._stuck and not stuck and not self.options.bundle:
                self._piped.clear()  # the episode is over: the next one may ask again
            self._stuck = stuck or self.options.bundle

    def fetch(self, job: JobProcesses) -> None:
        """One round over every rank (those asked over the network in parallel, each bounded); then one analysis."""
        sockets = hookclient.armed_ranks(Path(job.run_dir)) if job.run_dir else {}
        since = job.started_at or 0.0
        ranks = [p for p in job.ranks if p.rank is not None]
        with self._lock:
            self._failed.clear()  # said again if this round fails again
        # A rank asked over the network (its hook, a debug server) has a thread of its own, bounded by
        # its timeout; the others' dump files are looked at in turn in one thread (a thread each cost
        # more than the look: a stat of a file that is usually not there).
        asked = [p for p in ranks if sockets.get(p.rank) is not None
                 or (self.options.bundle and p.rank in self.options.debug_urls)]
        threads = [_thread(self._fetch_rank, p, sockets.get(p.rank), since, name="tw-flight-recorder",
                           lost=functools.partial(self._lost, p.rank)) for p in asked]
        files_only = [p for p in ranks if p not in asked]
        if files_only:
            threads.append(_thread(self._fetch_files, files_only, since, name="tw-flight-recorder-files",
                                   lost=functools.partial(self._lost, files_only[0].rank)))
        for thread in threads:
            thread.start()
        bound = self.options.hook_timeout + 1.0 + (2 * self.options.hook_timeout if self.options.debug_urls else 0)
        deadline = time.monotonic() + bound
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._analyse()

    def reading(self, job: JobProcesses) -> Reading:
        with self._lock:
            state = self._state
            failed = tuple(f"rank {rank}: Flight Recorder read failed: {why}" for rank, why in sorted(self._failed.items()))
            if not self.options.bundle:
                return Reading(state, notes=failed)
            traces = dict(self._traces)
            notes = {rank: list(found) for rank, found in self._notes.items()}
            for proc in job.ranks:
                if proc.rank is not None and proc.rank not in traces:
                    notes.setdefault(proc.rank, []).append("no Flight Recorder trace obtainable")
            worked: dict[str, list[str]] = {}
            for rank, found in sorted(traces.items()):
                worked.setdefault(found.source, []).append(f"rank {rank}")
            return Reading(state, notes=failed, files=dict(self._files),
                           worked={name: tuple(where) for name, where in worked.items()},
                           rank_notes={rank: tuple(dict.fromkeys(n)) for rank, n in notes.items()})

    def wait(self, deadline: float) -> None:
        for _ in range(2):  # pipes the fetch has just triggered, too
            with self._lock:
                threads = list(self._pipes)
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        self._closed.set()

    def _lost(self, rank: int, exc: Exception) -> None:
        with self._lock:
            why = f"{type(exc).__name__}: {exc}"[:300]
            self._failed[rank] = why
            self._notes.setdefault(rank, []).append(f"Flight Recorder read failed: {why}")

    # -- one rank ------------------------------------------------------------------------------
    def _fetch_files(self, ranks: list[RankProcess], since: float) -> None:
        """:meth:`_fetch_rank` for ranks without a hook, one after another (one rank's bug costs only its own)."""
        for proc in ranks:
            try:
                self._fetch_rank(proc, None, since)
            except Exception as exc:  # noqa: BLE001 - as _thread: a damaged trace must not take the others down
                self._lost(proc.rank, exc)

    def _fetch_rank(self, proc: RankProcess, sock: Path | None, since: float) -> None:
        rank = proc.rank
        assert rank is not None
        hooked = sock is not None and self._from_hook(rank, sock)
        if hooked and not self.options.bundle:
            return  # the hook answered: nothing fresher to be had (a bundle keeps the dumps too)
        env = self.env(proc)
        with self._lock:
            if rank in self._awaiting:
                return  # the file being written is the pipe's: its waiter reads it
        for prefix in nccl_state.fr_prefixes(env):
            trace = self._read_dump(rank, Path(f"{prefix}{rank}"), since)
            if trace is not None:
                self._store(rank, trace)
        if self.options.bundle and rank in self.options.debug_urls:
            self._from_debug_server(rank, self.options.debug_urls[rank])
        if not hooked:
            self._maybe_pipe(rank, env)

    def _from_hook(self, rank: int, sock: Path) -> bool:
        got = from_hook(sock, self.options.hook_timeout)
        if self.options.bundle:
            for name, trace in got.traces:  # each recorder's trace, as torch dumped it
                kind = "nccl_trace" if name == "nccl" else "fr_trace"
                self._keep(rank, f"flight-recorder/hook-{kind}.json", json.dumps(trace).encode())
            if got.error is not None:
                self._note(rank, f"Flight Recorder from the hook: {got.error}")
            elif got.found is None:
                self._note(rank, "Flight Recorder from the hook: no collective recorded"
                           + (f" ({'; '.join(got.notes)})" if got.notes else ""))
        if got.found is None:
            return False
        self._store(rank, got.found)
        return True

    def _from_debug_server(self, rank: int, url: str) -> None:
        found = nccl_state.fetch_debug_handler(url, "fr_trace_json", timeout=self.options.hook_timeout * 2)
        if found.data is None:
            self._note(rank, f"torch.distributed.debug fr_trace_json: {found.note}")
            return
        self._keep(rank, "flight-recorder/debug-server-fr_trace.json", found.data)
        try:
            trace = found_trace(found.data, "debug-server", time.time())
        except flightrec.TraceError as exc:
            self._note(rank, f"{found.origin}: {exc}")
            return
        if trace is not None:
            self._store(rank, trace)

    def _read_dump(self, rank: int, path: Path, since: float = 0.0, source: str = "flight-recorder-file",
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
            data = nccl_state.read_capped(path)
            self._keep(rank, f"flight-recorder/{source}-{path.name}", data)
            found = found_trace(data, source, info.st_mtime)
        except flightrec.TraceError as exc:
            self._note(rank, f"{path}: {exc}")
            return None  # half written, or no trace: read again next time
        except OSError:
            return None  # gone or unreadable: read again next time
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
            thread = _thread(self._await_pipe, rank, env, name="tw-flight-recorder-pipe",
                             lost=functools.partial(self._lost, rank))
            self._pipes = [t for t in self._pipes if t.is_alive()] + [thread]
        thread.start()

    def _await_pipe(self, rank: int, env: dict[str, str]) -> None:
        trace = None
        try:
            found = nccl_state.dump_through_pipe(rank, env, wait_s=self.options.pipe_wait, stop=self._closed,
                                                 accept=flightrec.is_trace)
            if found.data is None:
                self._note(rank, f"{found.source}: {found.note}")
            trace = self._read_dump(rank, Path(found.origin), source="pipe", again=True) if found.data else None
            if trace is not None:
                self._store(rank, trace)
        finally:
            with self._lock:
                self._awaiting.discard(rank)
        if trace is not None:
            self._analyse()

    # -- state -----------------------------------------------------------------------------------
    def _store(self, rank: int, new: flightrec.FoundTrace) -> None:
        """Keep the trace of a rank that counts (``flightrec.fresher``)."""
        with self._lock:
            self._traces[rank] = flightrec.fresher(self._traces.get(rank), new)

    def _keep(self, rank: int, name: str, data: bytes) -> None:
        """Bundles: the raw trace as read."""
        if self.options.bundle:
            with self._lock:
                self._files[f"ranks/{rank}/{name}"] = data

    def _note(self, rank: int, text: str) -> None:
        if self.options.bundle:
            with self._lock:
                self._notes.setdefault(rank, []).append(text)

    def _analyse(self) -> None:
        with self._analysis:
            with self._lock:
                traces = dict(self._traces)
            if not traces:
                return
            source = "+".join(sorted({t.source for t in traces.values()}))
            state = flightrec.read_rows({rank: t.trace for rank, t in traces.items()}, source=source)
            with self._lock:
                self._state = state


@dataclass(frozen=True, repr=False)
class HookTraces(Record):
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


def _thread(target: Callable[..., None], *args: object, name: str,
            lost: Callable[[Exception], None]) -> threading.Thread:
    """A daemon thread that hands a probe bug to ``lost`` instead of printing a traceback over the TUI."""
    def run() -> None:
        try:
            target(*args)
        except Exception as exc:  # noqa: BLE001 - a damaged trace or record must not take the feed (or the screen) down
            lost(exc)

    return threading.Thread(target=run, name=name, daemon=True)
