"""NCCL RAS: the whole job's view from NCCL itself, asked at the address the ranks name.

One bounded query at most every ``interval`` seconds (RAS gathers from every process of the
job); the last two replies are kept raw, as ``ObservedRas`` records, for ``judge/ras.py`` to
judge across polls. Another job's report (none of this job's PIDs) is no evidence: it gets a
note that lasts until the next reply. A refused connection (no RAS) says nothing.

Bundles ask every address the ranks name, once, for the text report a person reads
(``host/ras.txt``) and the JSON one where the service has it (``host/ras.json``).
"""

from __future__ import annotations

import threading
import time

from . import CollectiveSource, FeedOptions, RankEnvs, Reading
from .. import nccl_state, ras
from ..process import JobProcesses
from ...observed import ObservedRas


class Source(CollectiveSource):
    field = "ras"
    interval = 2.0

    def __init__(self, options: FeedOptions, envs: RankEnvs | None = None) -> None:
        super().__init__(options, envs)
        self._lock = threading.Lock()
        self._replies: tuple[tuple[ras.RasReply, float], ...] = ()  # recent replies and when asked, oldest first
        self._read: dict[float, tuple[ObservedRas, str | None]] = {}  # replies read, by when asked
        self._files: dict[str, bytes] = {}
        self._notes: list[str] = []
        self._worked: list[str] = []

    def fetch(self, job: JobProcesses) -> None:
        ranks = [p for p in job.ranks if p.rank is not None]
        if not ranks:
            return
        envs = [self.env(p) for p in (ranks if self.options.bundle else ranks[:1])]
        if all(ras.disabled(env) for env in envs):
            if self.options.bundle:
                self._notes.append("NCCL RAS: off in this job (NCCL_RAS_ENABLE=0)")
            return
        for host, port in sorted({ras.address(env) for env in envs}):
            if self.options.bundle:
                self._text_report(host, port)
            at = time.time()
            reply = ras.query(host, port)
            if self.options.bundle and reply.format == "json" and reply.raw:
                self._files["host/ras.json"] = reply.raw
            if self.options.bundle and reply.note and reply.raw is not None:
                self._notes.append(f"NCCL RAS: {reply.note}")
            with self._lock:
                self._replies = (*self._replies, (reply, at))[-2:]

    def _text_report(self, host: str, port: int) -> None:
        text = ras.query(host, port, want_json=False)
        if text.raw is None:
            self._notes.append(f"NCCL RAS: {text.note}")
            return
        self._files["host/ras.txt"] = text.raw
        summary = nccl_state.summarize_ras(text.raw.decode(errors="replace"))
        self._files["host/ras-summary.txt"] = ("\n".join(summary) + "\n").encode()
        self._worked.append(f"{host}:{port}")
        if text.note:
            self._notes.append(f"NCCL RAS: {text.note}")

    def reading(self, job: JobProcesses) -> Reading:
        with self._lock:
            replies = self._replies
        pids = {p.pid for p in job.ranks}
        seen = []
        for reply, at in replies:
            if at not in self._read:
                whose = ras.ownership(reply.report, pids) if reply.report is not None else None
                note = whose or (f"NCCL RAS: {reply.note}" if reply.raw and reply.note else None)
                names = tuple(ras.local_names().items()) if reply.report is not None and not whose else ()
                self._read = {a: v for a, v in self._read.items() if a > at - 60.0}
                self._read[at] = (ObservedRas(reply.origin, at, None if whose else reply.report, names), note)
            seen.append(self._read[at])
        observed = tuple(o for o, _ in seen)
        if self.options.bundle:
            notes = [*self._notes, *(note for _, note in seen if note)]
            return Reading(tuple(o for o in observed if o.report is not None)[:1], tuple(dict.fromkeys(notes)),
                           files=dict(self._files), worked={"ras": tuple(self._worked)} if self._worked else {})
        return Reading(observed, (seen[-1][1],) if seen and seen[-1][1] else ())
