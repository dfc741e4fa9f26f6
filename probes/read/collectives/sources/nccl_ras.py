"""NCCL RAS: the whole job's view from NCCL itself, asked at the address the ranks name.

One bounded query at a time (never two, in this process or, through :class:`ras.QueryLock`, in
any trainwatch process on the node) at most every ``interval`` seconds; the last two replies are
kept raw, as ``ObservedRas`` records, for ``judge/ras.py`` to judge across polls. Whose report
came back is decided by ``ras.ownership``: another job's is no evidence (a note that lasts until
the next reply); one that cannot be matched to the job is kept with a caveat. A refused
connection (no RAS) says nothing; every other reply that is not a report (partial, empty,
unreadable) is a note, never dropped in silence; a partial one is not evidence, so the judge
keeps what the last whole reply said. A reply with ranks RAS could not reach is
followed at once by a second query: unreachable ranks are named only when two replies agree.

NCCL versions where a client's query is known to crash or wedge the job are not asked unless
``TRAINWATCH_RAS=always`` (``--ras always``); ``never`` turns RAS off (:data:`UNSAFE`).

Bundles ask every address the ranks name, once, for the text report a person reads
(``host/ras.txt``) and the JSON one where the service has it (``host/ras.json``).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from . import CollectiveSource, FeedOptions, RankEnvs, Reading
from .. import nccl_state, ras, ras_report
from ...processes import peers, procfacts
from ...processes.process import JobProcesses, RankProcess
from ....observed import ObservedRas
from ....record import Record

# NCCL versions whose RAS service a client's query is known to crash or corrupt, from NVIDIA's own
# issues and the code at each tag (read 2026-11): (low, high, what), low <= version < high. A version
# read as unknown is asked (RAS itself needs NCCL >= 2.24).
UNSAFE: tuple[tuple[tuple[int, ...], tuple[int, ...], str], ...] = (
    ((2, 26), (2, 27, 3), "crash the job when it comes while a communicator initializes (NVIDIA/nccl #1669, "
                          "#1718; fixed in 2.27.3)"),
    ((2, 26), (2, 29, 2), "corrupt the job's memory when a communicator has missing ranks, as in a hang "
                          "(NVIDIA/nccl #1762; fixed in 2.29.2)"),
)
# From 2.27.3 on, the *text* report can crash the job while communicators are being created (a
# zero status indexes past NCCL's status names; NVIDIA/nccl #2346, open, still in 2.30.7). The JSON
# report returns before that code: with a version from here on, only JSON is asked for.
TEXT_UNSAFE_FROM = (2, 27, 3)
TEXT_UNSAFE = "NCCL's text report can crash the job while communicators are being created (NVIDIA/nccl #2346)"
FOLLOW_UP_WITHIN_S = 30.0  # a reply with unreachable ranks and no other reply this recent is asked again at once
LOCK_WAIT_S = 0.5  # live polls: how long to wait for another trainwatch's query to end (one-shots wait longer)


@dataclass(frozen=True, repr=False)
class _Pending(Record):
    origin: str
    started: float  # monotonic
    bound: float  # seconds NCCL may take, plus our margin


class Source(CollectiveSource):
    field = "ras"
    interval = 2.0

    def __init__(self, options: FeedOptions, envs: RankEnvs | None = None) -> None:
        super().__init__(options, envs)
        self._lock = threading.Lock()
        self._asking = threading.Lock()  # held while a fetch runs: never two queries from this source
        self._closed = threading.Event()
        self._replies: tuple[tuple[ras.RasReply, float], ...] = ()  # recent replies and when asked, oldest first
        self._read: dict[float, tuple[ObservedRas, str | None]] = {}  # replies read, by when asked
        self._pending: _Pending | None = None
        self._skipped: str | None = None  # why the last fetch asked nothing (lock, gap, version)
        self._nccl: dict[int, tuple[bool, str | None]] = {}  # pid -> (libnccl mapped, version)
        self._ras_seen: set[int] = set()  # PIDs seen using NCCL (RAS may answer for them)
        self._files: dict[str, bytes] = {}
        self._notes: list[str] = []
        self._worked: list[str] = []

    def fetch(self, job: JobProcesses) -> None:
        if not self._asking.acquire(blocking=False):
            return  # the previous query is still out
        try:
            self._fetch(job)
        finally:
            self._asking.release()

    def _fetch(self, job: JobProcesses) -> None:
        ranks = [p for p in job.ranks if p.rank is not None]
        if not ranks:
            return
        envs = [self.env(p) for p in (ranks if self.options.bundle else ranks[:1])]
        if not self._uses_nccl(ranks[0], envs[0]):
            return  # a gloo (or CPU) job has no RAS to ask, nor anything to say about it
        if all(ras.disabled(env) for env in envs):
            if self.options.bundle:
                self._notes.append("NCCL RAS: off in this job (NCCL_RAS_ENABLE=0)")
            return
        refused = self._refused(ranks[0])
        self._skipped = refused
        if refused:
            if self.options.bundle:
                self._notes.append(f"NCCL RAS: {refused}")
            return
        json_only = self._json_only(ranks[0])
        factor = max(ras.timeout_factor(env) for env in envs)
        for host, port in sorted({ras.address(env) for env in envs}):
            lock = ras.QueryLock(host, port)
            why = lock.acquire(timeout=ras.reply_bound(factor=factor) if self.options.bundle else LOCK_WAIT_S)
            if why:
                self._skipped = f"NCCL RAS at {host}:{port}: {why}"
                continue
            try:
                if self.options.bundle and not json_only:
                    self._text_report(host, port, factor)
                elif self.options.bundle:
                    self._notes.append(f"NCCL RAS: no text report asked for ({TEXT_UNSAFE}); the JSON one is kept")
                reply, at = self._ask(host, port, factor, json_only)
                if self.options.bundle and reply.format == "json" and reply.raw:
                    self._files["host/ras.json"] = reply.raw
                if self.options.bundle and reply.note and reply.raw is not None:
                    self._notes.append(f"NCCL RAS: {reply.note}")
                if self._needs_second(reply, at) and not self._closed.is_set():
                    self._ask(host, port, factor, json_only)
            finally:
                lock.release()

    def _ask(self, host: str, port: int, factor: float, json_only: bool = False) -> tuple[ras.RasReply, float]:
        """One query, visible as pending while it runs; the reply kept with when it was asked."""
        at = time.time()
        self._pending = _Pending(f"{host}:{port}", time.monotonic(), ras.reply_bound(factor=factor))
        try:
            reply = ras.query(host, port, factor=factor, text_fallback=not json_only)
        finally:
            self._pending = None
        with self._lock:
            self._replies = (*self._replies, (reply, at))[-2:]
        return reply, at

    def _needs_second(self, reply: ras.RasReply, at: float) -> bool:
        """Unreachable ranks are named only when two replies agree: ask again now unless a recent one exists."""
        if reply.report is None or not any(r.status == "unreachable" for c in reply.report.comms for r in c.ranks):
            return False
        with self._lock:
            earlier = [a for r, a in self._replies if a < at and r.report is not None]
        return not earlier or at - max(earlier) > FOLLOW_UP_WITHIN_S

    def _version(self, proc: RankProcess) -> tuple[bool, str | None, tuple[int, ...]]:
        """(libnccl mapped, its version, the version as numbers), read once per PID."""
        if proc.pid not in self._nccl:
            self._nccl[proc.pid] = procfacts.loaded_nccl(proc.pid)
        mapped, version = self._nccl[proc.pid]
        return mapped, version, ras_report.version_tuple(version)

    def _uses_nccl(self, proc: RankProcess, env: dict[str, str]) -> bool:
        """Whether the job uses NCCL, so RAS may run in it: the rank has libnccl mapped, its
        environment names a RAS address, or it listens on the RAS port itself (NCCL linked into
        another library). Once seen, remembered for the PID."""
        if proc.pid in self._ras_seen or self._version(proc)[0] or "NCCL_RAS_ADDR" in env \
                or peers.listens_on(proc.pid, ras.address(env)[1]):
            self._ras_seen.add(proc.pid)
            return True
        return False

    def _json_only(self, proc: RankProcess) -> bool:
        """A version whose text report can crash the job: ask for JSON only (whatever the policy)."""
        return self._version(proc)[2] >= TEXT_UNSAFE_FROM

    def _refused(self, proc: RankProcess) -> str | None:
        """Why RAS is not asked for this job: turned off, or an NCCL version a query can crash."""
        policy = (os.environ.get("TRAINWATCH_RAS") or "auto").strip().lower()
        if policy == "never":
            return "not asked (TRAINWATCH_RAS=never)"
        if policy == "always" or not UNSAFE:
            return None
        _, version, found = self._version(proc)
        for low, high, why in UNSAFE:
            if found and low <= found < high:
                return (f"not asked: the job runs NCCL {version}, where a RAS client's query is known to {why}; "
                        "`--ras always` (TRAINWATCH_RAS=always) asks anyway")
        return None

    def _text_report(self, host: str, port: int, factor: float) -> None:
        text = ras.query(host, port, want_json=False, factor=factor)
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
        seen = [self._judged_owner(job, reply, at) for reply, at in replies]
        # A partial reply is no evidence at all: the judge keeps what the last whole reply said.
        observed = tuple(o for (o, _), (reply, _) in zip(seen, replies) if not reply.partial)
        pending = self._pending_note()
        if self.options.bundle:
            notes = [*self._notes, *(note for _, note in seen if note), *([pending] if pending else [])]
            return Reading(tuple(o for o in observed if o.report is not None)[-1:], tuple(dict.fromkeys(notes)),
                           files=dict(self._files), worked={"ras": tuple(self._worked)} if self._worked else {})
        notes = [note for note in ((seen[-1][1] if seen else None), pending, self._skipped) if note]
        return Reading(observed, tuple(dict.fromkeys(notes)))

    def _judged_owner(self, job: JobProcesses, reply: ras.RasReply, at: float) -> tuple[ObservedRas, str | None]:
        """The reply as evidence (None where it is another job's), read once per reply, and its note."""
        if at in self._read:
            return self._read[at]
        note, caveat, report = None, None, reply.report
        names: dict[str, str] = {}
        if report is not None:
            names = ras.local_names()  # only with a report: they cost psutil's import
            owner = ras.ownership(report, {p.pid for p in job.ranks}, world_size=job.world_size,
                                  local_ranks=len(job.ranks) or None, local_hosts=names)
            note = f"NCCL RAS: {owner.note}" if owner.note else None
            caveat = owner.note if owner.verdict == "unsure" else None
            report = None if owner.verdict == "other" else report
        elif reply.raw is not None and reply.note:
            note = f"NCCL RAS: {reply.note}"
        self._read = {a: v for a, v in self._read.items() if a > at - 60.0}
        self._read[at] = (ObservedRas(reply.origin, at, report, tuple(names.items()) if report else (), caveat), note)
        return self._read[at]

    def _pending_note(self) -> str | None:
        pending = self._pending
        if pending is None:
            return None
        waited = time.monotonic() - pending.started
        if waited < 1.0:
            return None
        return (f"NCCL RAS at {pending.origin}: answer pending for {waited:.0f} s (NCCL may take up to "
                f"{pending.bound - ras.EXTRA_S:g} s when ranks do not answer); judged without it so far")

    def wait(self, deadline: float) -> None:
        """Until ``deadline``, and past it while a query is out, up to NCCL's own bound for it
        (the RAS wait is part of a one-shot's window); a follow-up query counts as well."""
        limit = deadline
        while not self._closed.is_set():
            pending = self._pending
            if pending is not None:
                limit = max(limit, min(pending.started + pending.bound, deadline + 2 * pending.bound))
            elif not self._asking.locked():
                return
            if time.monotonic() >= limit:
                return
            time.sleep(0.05)

    def close(self) -> None:
        self._closed.set()
