"""The Flight Recorder an armed rank left in its last words (``ranks/<rank>/last-words.json``), and
the survivors' own at a first death.

The hook writes it as the rank is stopped (SIGTERM, SIGINT) or raises: the freshest record of its
collectives there is, for gloo as for NCCL. ``trainwatch open`` reads it with everything else the
job left (``read/logs/leftovers.py``); ``watch`` reads it at a crash, when the ranks that were
failed by a peer's death have just written it, and asks each survivor's hook for its trace the
moment the first rank dies (a launcher's teardown may cut a rank's last words short).
"""

from __future__ import annotations

import threading
from pathlib import Path

from . import flightrec, hookclient
from ... import rundir
from ...snapshot import CollectiveState


def trace_of(record: dict) -> tuple[dict | None, list[str]]:
    """The rank's merged trace in a last-words record (NCCL's and the generic recorder's), and
    notes for what could not be read."""
    text = record.get("fr")
    if not isinstance(text, str):
        error = record.get("fr_error")
        return None, [f"no Flight Recorder ({error})"] if error else []
    try:
        traces, notes = flightrec.hook_reply_traces(text)
    except flightrec.TraceError as exc:
        return None, [f"Flight Recorder unreadable ({exc})"]
    return flightrec.merge_traces([trace for _, trace in traces]), notes


def run_dir_state(run_dir: Path, ranks: list[int], since: float = 0.0) -> CollectiveState | None:
    """Each of these ranks' collectives from the last words it left in ``run_dir`` after ``since``
    (an earlier attempt's are not this one's), as one collective state (source ``last-words``)."""
    traces = {}
    for rank in ranks:
        path = rundir.last_words_file(run_dir, rank)
        record = rundir.read_json(path) if path.is_file() else None
        if not record or (isinstance(record.get("at"), (int, float)) and record["at"] < since):
            continue
        trace, _ = trace_of(record)
        if trace is not None:
            traces[rank] = trace
    return flightrec.read_rows(traces, source="last-words") if traces else None


def signalled_at(run_dir: Path, ranks: list[int], since: float = 0.0) -> float | None:
    """When the first of these ranks was told to stop (SIGTERM, SIGINT, ...), after ``since``: when
    faulthandler's C handler wrote its trace (the log's time: at the signal itself, even while the
    main thread is blocked in C++), or when the hook's last words say they began (written from a
    thread the signal woke: later on a loaded node). None when no rank left either."""
    times = []
    for rank in ranks:
        try:
            log = rundir.last_words_log(run_dir, rank).stat()  # made empty when the hook armed the rank
            if log.st_size and log.st_mtime >= since:
                times.append(log.st_mtime)
        except OSError:  # no trace: not signalled, or not armed for it
            pass
        path = rundir.last_words_file(run_dir, rank)
        record = rundir.read_json(path) if path.is_file() else None
        at = record.get("at") if record else None
        if isinstance(at, (int, float)) and at >= since and str(record.get("trigger", "")).startswith("SIG"):
            times.append(float(at))
    return min(times, default=None)


def survivors_state(run_dir: Path, ranks: list[int], timeout: float = 1.0) -> CollectiveState | None:
    """Each of these armed ranks' collectives, asked of its hook now, all at once, each bounded
    (source ``hook``); ranks that do not answer in time are left out."""
    sockets = hookclient.armed_ranks(run_dir)
    traces: dict[int, dict] = {}
    lock = threading.Lock()

    def ask(rank: int, sock: Path) -> None:
        reply = hookclient.request(sock, "fr_trace", timeout=timeout)
        if not reply.ok:
            return
        try:
            found, _ = flightrec.hook_reply_traces(reply.text)
        except flightrec.TraceError:
            return
        merged = flightrec.merge_traces([trace for _, trace in found])
        if merged is not None:
            with lock:
                traces[rank] = merged

    threads = [threading.Thread(target=ask, args=(rank, sockets[rank]), name="tw-fr-at-death", daemon=True)
               for rank in ranks if rank in sockets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 0.5)
    with lock:
        return flightrec.read_rows(dict(traces), source="hook") if traces else None
