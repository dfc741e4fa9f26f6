"""A bounded client for NCCL's RAS service: one TCP connection, the real client protocol.

The protocol, as NCCL's own client speaks it (NVIDIA/nccl ``src/ras/client.cc`` and the server
side ``rasClientEventLoop`` in ``src/ras/client_support.cc``, v2.29.2; ``src/ras/ras_internal.h``:
``NCCL_RAS_CLIENT_PROTOCOL 2``, port 28028, ``RAS_COLLECTIVE_LEG_TIMEOUT_SEC 5``), one command
per line:

* ``CLIENT PROTOCOL 2`` -> ``SERVER PROTOCOL <n>`` (any n is read on; NCCL's client does the same);
* ``TIMEOUT <s>`` -> ``OK``: how long the answering process waits for the others' data;
* ``SET FORMAT json`` -> ``OK`` (NCCL >= 2.28.7) or ``ERROR: Unknown command ...`` (older: text);
* ``VERBOSE STATUS`` -> the report; the server closes the connection when it has sent it.

Every RAS thread of a job (one per rank process) listens on ``NCCL_RAS_ADDR`` (default
``localhost:28028``) with ``SO_REUSEPORT``: on a node running several jobs, the kernel hands each
connection to any of them. Whose report came back is decided by :func:`ownership`. A job without
RAS (refused, NCCL < 2.24, ``NCCL_RAS_ENABLE=0``) says nothing.

The server sends its header at once and the report only when its own collective over the job
ends: up to ``TIMEOUT`` + 5 x ``NCCL_RAS_TIMEOUT_FACTOR`` s when ranks do not answer (NCCL's own
client waits 1 + 5 + 5 = 11 s). A reply is whole only when the server closed the connection; one
cut at our deadline is *partial* (kept raw, never a report). Asking is serialized per address
across every trainwatch process on the node (:class:`QueryLock`).
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import time
from dataclasses import dataclass
from typing import Iterable


from . import ras_report
from .ras_report import PartialReport, RasReport, ReportError
from ... import rundir
from ...record import Record

DEFAULT_PORT = 28028
CLIENT_PROTOCOL = 2
RAS_TIMEOUT_S = 5  # asked of RAS: its wait for slow peers (NCCL's own default; less reads slow ranks as lost)
CONNECT_TIMEOUT_S = 1.0
LEGS = 5  # NCCL's collective may add RAS_COLLECTIVE_LEG_TIMEOUT_SEC (5) x the timeout factor
EXTRA_S = 2.0  # our read deadline beyond the longest NCCL's server can take
MAX_BYTES = 64 * 1024 * 1024
MIN_GAP_S = 1.5  # between two queries to one address from any trainwatch process on the node
STALE_LOCK_S = 3600.0  # a lock file not used for this long is removed (when nobody holds it)


def reply_bound(ras_timeout: float = RAS_TIMEOUT_S, factor: float = 1.0) -> float:
    """Seconds NCCL's server may take to send a whole report, plus our margin."""
    return ras_timeout + LEGS * factor + EXTRA_S


def timeout_factor(env: dict[str, str]) -> float:
    """``NCCL_RAS_TIMEOUT_FACTOR`` (default 1): scales NCCL's own RAS timeouts."""
    try:
        return max(1.0, float(env.get("NCCL_RAS_TIMEOUT_FACTOR") or 1))
    except ValueError:
        return 1.0


@dataclass(frozen=True, repr=False)
class RasReply(Record):
    """One query's outcome: the raw report and what it parsed to, or why there is none."""

    origin: str  # host:port asked
    raw: bytes | None = None
    format: str | None = None  # "json" or "text"
    report: RasReport | None = None
    note: str | None = None  # why there is no report, or what to know about it
    elapsed_s: float = 0.0
    sent_bytes: int = 0
    partial: bool = False  # the server had not finished: what came is kept raw, never read as a report


def address(env: dict[str, str]) -> tuple[str, int]:
    """``NCCL_RAS_ADDR`` (``host:port``, ``[v6]:port``), default ``localhost:28028``."""
    value = (env.get("NCCL_RAS_ADDR") or "").strip()
    host, sep, port = value.rpartition(":")
    if not sep or "]" in port:  # no port given ("host" or "[::1]")
        host, port = value, ""
    try:
        number = int(port) if port else DEFAULT_PORT
    except ValueError:
        number = DEFAULT_PORT
    return host.strip("[]") or "localhost", number


def disabled(env: dict[str, str]) -> bool:
    """``NCCL_RAS_ENABLE=0`` turns RAS off in the job."""
    return (env.get("NCCL_RAS_ENABLE") or "").strip() == "0"


def _ascii(host: str) -> str | bytes:
    return host.encode() if host.isascii() else host


def query(host: str, port: int, *, timeout: float = CONNECT_TIMEOUT_S, ras_timeout: int = RAS_TIMEOUT_S,
          want_json: bool = True, verbose: bool = True, limit: int = MAX_BYTES, factor: float = 1.0,
          bound: float | None = None, text_fallback: bool = True) -> RasReply:
    """Handshake, ``TIMEOUT``, ``SET FORMAT json`` (text where unsupported), ``[VERBOSE] STATUS``,
    then read to the server's close. Bounded: connect and every reply within ``timeout``, the
    report within ``bound`` (default :func:`reply_bound`). ``text_fallback=False``: a server that
    refuses JSON is not asked for the text report (a version whose text formatter can crash the
    job). Never raises for a missing or odd service."""
    origin = f"{host}:{port}"
    started = time.monotonic()
    sent = 0

    def reply(**kwargs) -> RasReply:
        return RasReply(origin, elapsed_s=time.monotonic() - started, sent_bytes=sent, **kwargs)

    try:
        # An ASCII name as bytes: a str is encoded as IDNA first, which imports a codec (4 ms)
        with socket.create_connection((_ascii(host), port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            lines = _Lines(conn)
            sent += _send(conn, f"CLIENT PROTOCOL {CLIENT_PROTOCOL}\n")
            hello = lines.next()
            if not hello.upper().startswith("SERVER PROTOCOL"):
                return reply(note=f"{origin} is not NCCL RAS (answered {hello[:60]!r})")
            sent += _send(conn, f"TIMEOUT {int(ras_timeout)}\n")
            lines.next()  # "OK"; an older or odd server's error changes nothing below
            fmt = "text"
            if want_json:
                sent += _send(conn, "SET FORMAT json\n")
                fmt = "json" if lines.next().upper() == "OK" else "text"
                if fmt == "text" and not text_fallback:
                    return reply(note=f"NCCL RAS at {origin} refused JSON, and its text report is not asked for")
            sent += _send(conn, "VERBOSE STATUS\n" if verbose else "STATUS\n")
            wait = bound if bound is not None else reply_bound(ras_timeout, factor)
            raw, closed = lines.rest(limit, deadline=time.monotonic() + wait)
    except socket.timeout:
        return reply(note=f"NCCL RAS at {origin} did not answer within {timeout:g}s")
    except _Closed:
        return reply(note=f"NCCL RAS at {origin} closed the connection during the handshake")
    except OSError as exc:
        why = exc.strerror or str(exc)
        return reply(note=f"no NCCL RAS at {origin} ({why}; needs NCCL >= 2.24 with RAS on, the default)")
    took = time.monotonic() - started
    if not closed:
        return reply(raw=raw, format=fmt, partial=True,
                     note=f"NCCL RAS at {origin} was still gathering after {took:.0f} s ({len(raw)} bytes so far, "
                          f"NCCL may take {reply_bound(ras_timeout, factor) - EXTRA_S:g} s when ranks do not "
                          "answer): partial, not read as a report")
    if not raw.strip():
        return reply(raw=raw, format=fmt, note=f"NCCL RAS at {origin} closed the connection without a report")
    try:
        report = ras_report.parse(raw.decode(errors="replace"))
    except PartialReport as exc:
        return reply(raw=raw, format=fmt, partial=True, note=f"NCCL RAS at {origin}: partial report ({exc}), not read")
    except ReportError as exc:
        return reply(raw=raw, format=fmt, note=f"NCCL RAS at {origin}: unreadable report ({exc})")
    return reply(raw=raw, format=report.format, report=report)


def local_names() -> dict[str, str]:
    """This node's addresses -> its host name: RAS names nodes by IP."""
    import psutil  # only here: RAS replies are rare, and psutil is 8 ms of every command's start

    try:
        addresses = psutil.net_if_addrs()
    except (OSError, psutil.Error):
        return {}
    name = socket.gethostname()
    return {a.address.split("%")[0]: name for items in addresses.values() for a in items
            if a.family in (socket.AF_INET, socket.AF_INET6) and not a.address.startswith(("127.", "::1"))}


@dataclass(frozen=True, repr=False)
class Ownership(Record):
    """Whose report it is: ``ours``, ``other`` (another job's: no evidence) or ``unsure`` (kept,
    labelled); ``note`` says why where it was not plain."""

    verdict: str
    note: str | None = None


def ownership(report: RasReport, job_pids: Iterable[int], *, world_size: int | None = None,
              local_ranks: int | None = None, local_hosts: Iterable[str] = ()) -> Ownership:
    """Whether ``report`` is this job's, from what identifies a job in NCCL's own output:

    * it names one of the job's rank PIDs: ours;
    * it names a process on this node that is not one of the job's ranks: another job's (RAS's
      port is shared by every job on the node);
    * JSON lists every rank of every communicator with its PID: none of ours is another job's;
    * text names only outliers, so a culprit on another node is all it may name: its job summary
      (processes in all, processes per node) and communicator sizes are held against the job's
      world size and this node's rank count. They match: ours; they differ: another job's;
    * nothing to hold it against (world size unknown): unsure, kept with a note."""
    pids = set(job_pids)
    named = report.processes_named()
    if {pid for _, pid in named} & pids:
        return Ownership("ours")
    local = set(local_hosts) | {"localhost"}
    strangers = sorted(pid for host, pid in named if host in local or host.startswith("127."))
    if strangers:
        return Ownership("other", _other_note(strangers, "are not this job's ranks"))
    if report.format == "json":
        if not report.comms:
            return Ownership("ours")  # nothing in it yet: no evidence either way
        listed = sorted(pid for _, pid in named)
        return Ownership("other", _other_note(listed, "are all it lists, none of them this job's ranks"))
    sizes = {c.size for c in report.comms if c.size} | ({report.processes} if report.processes else set())
    elsewhere = ", ".join(f"pid {pid} on {host}" for host, pid in sorted(named)[:4]) or "no process"
    if world_size and sizes:
        fits = world_size in sizes and (not local_ranks or not report.per_node or local_ranks in report.per_node)
        if fits:
            return Ownership("ours", None if not named else
                             f"NCCL RAS's report names only processes on other nodes ({elsewhere}); taken as this "
                             f"job's: its job summary matches the job (world size {world_size}"
                             + (f", {local_ranks} ranks on this node" if local_ranks else "") + ")")
        return Ownership("other", f"NCCL RAS answered for another job on this node (its job summary has "
                                  f"{report.processes or '?'} processes and communicators of "
                                  f"{', '.join(map(str, sorted(sizes)))} ranks; this job's world size is "
                                  f"{world_size}); the port is shared, a later poll may reach this job's")
    if not named:
        return Ownership("ours")
    return Ownership("unsure", f"could not tell whether NCCL RAS's report is this job's (it names only {elsewhere}, "
                               "and the job's world size is unknown): shown as NCCL gave it")


def _other_note(pids: list[int], why: str) -> str:
    shown = ", ".join(str(p) for p in pids[:6]) + (", ..." if len(pids) > 6 else "")
    return (f"NCCL RAS answered for another job on this node (its processes {shown} {why}; or trainwatch sees "
            "the job in another PID namespace); the port is shared, a later poll may reach this job's")


class QueryLock:
    """One RAS query at a time per address across every trainwatch process of this user on the
    node, and at most one every ``MIN_GAP_S``: an advisory ``flock`` on a file named for the
    address, which holds when the last query started (unix time, as text). Asking RAS has crashed
    and wedged jobs (NVIDIA/nccl #1669, #1718, #1762, #1996, #2346): never two at once.

    The files live in trainwatch's runtime folder (``rundir.runtime_dir``: owner-only); one unused
    for ``STALE_LOCK_S`` is removed by the next query, while holding its lock."""

    def __init__(self, host: str, port: int, directory: str | None = None) -> None:
        safe = re.sub(r"[^A-Za-z0-9.]", "_", host)
        self.directory = directory
        self.name = f"ras-{safe}-{port}.lock"
        self.path = os.path.join(directory, self.name) if directory else self.name
        self._fd: int | None = None

    def acquire(self, timeout: float = 0.0) -> str | None:
        """None once held; else why not (held by another trainwatch, asked too recently, no lock file)."""
        try:
            directory = self.directory or str(rundir.runtime_dir())
        except OSError as exc:
            return f"no folder for the RAS query lock ({exc.strerror or exc}): not asked"
        self.path = os.path.join(directory, self.name)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                return f"cannot open the RAS lock {self.path} ({exc.strerror}): not asked"
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.release()
                if time.monotonic() >= deadline:
                    return "another trainwatch process is asking NCCL RAS at this address: not asked this time"
                time.sleep(0.05)
                continue
            if _same_file(self._fd, self.path):
                break
            self.release()  # removed as stale meanwhile: lock the file that is there now
        try:
            last = float(os.pread(self._fd, 64, 0).decode() or "nan")
        except (OSError, ValueError):
            last = float("nan")
        since = time.time() - last
        if -1.0 < since < MIN_GAP_S:  # (the time is written rounded: a hair in the future is now)
            self.release()
            return f"NCCL RAS at this address was asked {max(0.0, since):.1f} s ago: not asked again so soon"
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{time.time():.3f}".encode(), 0)
        except OSError:
            pass  # a full disk: queries are still one at a time, the gap unrecorded
        _remove_stale(directory, keep=self.path)
        return None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open at ``fd`` (a stale one may have been removed)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _remove_stale(directory: str, keep: str) -> None:
    """Remove lock files nobody used for ``STALE_LOCK_S``, each while holding its lock (a process
    that opened it before then finds the path gone, and locks the new file)."""
    try:
        names = [n for n in os.listdir(directory) if n.startswith("ras-") and n.endswith(".lock")]
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            if path == keep or time.time() - os.stat(path).st_mtime < STALE_LOCK_S:
                continue
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # gone meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _same_file(fd, path):
                os.unlink(path)
        except OSError:
            pass  # held: in use, it stays
        finally:
            os.close(fd)


class _Closed(Exception):
    """The server closed the connection before a whole line came."""


class _Lines:
    """Reads a socket line by line, keeping what came after the last line."""

    def __init__(self, conn: socket.socket) -> None:
        self._conn, self._buffer = conn, b""

    def next(self, limit: int = 4096) -> str:
        while b"\n" not in self._buffer:
            if len(self._buffer) > limit:
                break
            chunk = self._conn.recv(4096)
            if not chunk:
                raise _Closed()
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace").strip()

    def rest(self, limit: int, deadline: float) -> tuple[bytes, bool]:
        """Everything up to the server's close (True) or the deadline or ``limit`` (False)."""
        chunks, size, closed = [self._buffer], len(self._buffer), False
        while size < limit:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._conn.settimeout(left)
            try:
                data = self._conn.recv(256 * 1024)
            except socket.timeout:
                break  # what came so far is kept, as a partial reply
            if not data:
                closed = True
                break
            chunks.append(data)
            size += len(data)
        return b"".join(chunks)[:limit], closed


def _send(conn: socket.socket, text: str) -> int:
    data = text.encode()
    conn.sendall(data)
    return len(data)
