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
connection to any of them. Whose report came back is checked against the job's rank PIDs
(:func:`ownership`). A job without RAS (refused, NCCL < 2.24, ``NCCL_RAS_ENABLE=0``) is a note.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Iterable

import psutil

from . import ras_report
from .ras_report import RasReport, ReportError

DEFAULT_PORT = 28028
CLIENT_PROTOCOL = 2
RAS_TIMEOUT_S = 5  # asked of RAS: its wait for slow peers (NCCL's own default; less reads slow ranks as lost)
CONNECT_TIMEOUT_S = 1.0
EXTRA_S = 3.0  # our read deadline beyond RAS's own wait
MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class RasReply:
    """One query's outcome: the raw report and what it parsed to, or why there is none."""

    origin: str  # host:port asked
    raw: bytes | None = None
    format: str | None = None  # "json" or "text"
    report: RasReport | None = None
    note: str | None = None  # why there is no report, or what to know about it
    elapsed_s: float = 0.0
    sent_bytes: int = 0


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


def query(host: str, port: int, *, timeout: float = CONNECT_TIMEOUT_S, ras_timeout: int = RAS_TIMEOUT_S,
          want_json: bool = True, verbose: bool = True, limit: int = MAX_BYTES) -> RasReply:
    """Handshake, ``TIMEOUT``, ``SET FORMAT json`` (text where unsupported), ``[VERBOSE] STATUS``,
    then read to the server's close. Bounded: connect and every reply within ``timeout``, the
    report within ``ras_timeout + EXTRA_S``. Never raises for a missing or odd service."""
    origin = f"{host}:{port}"
    started = time.monotonic()
    sent = 0

    def reply(**kwargs) -> RasReply:
        return RasReply(origin, elapsed_s=time.monotonic() - started, sent_bytes=sent, **kwargs)

    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
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
            sent += _send(conn, "VERBOSE STATUS\n" if verbose else "STATUS\n")
            raw = lines.rest(limit, deadline=time.monotonic() + ras_timeout + EXTRA_S)
    except socket.timeout:
        return reply(note=f"NCCL RAS at {origin} did not answer within {timeout:g}s")
    except _Closed:
        return reply(note=f"NCCL RAS at {origin} closed the connection during the handshake")
    except OSError as exc:
        why = exc.strerror or str(exc)
        return reply(note=f"no NCCL RAS at {origin} ({why}; needs NCCL >= 2.24 with RAS on, the default)")
    if not raw.strip():
        return reply(raw=raw, format=fmt, note=f"NCCL RAS at {origin} sent no report")
    try:
        report = ras_report.parse(raw.decode(errors="replace"))
    except ReportError as exc:
        return reply(raw=raw, format=fmt, note=f"NCCL RAS at {origin}: unreadable report ({exc})")
    return reply(raw=raw, format=report.format, report=report)


def local_names() -> dict[str, str]:
    """This node's addresses -> its host name: RAS names nodes by IP."""
    try:
        addresses = psutil.net_if_addrs()
    except (OSError, psutil.Error):
        return {}
    name = socket.gethostname()
    return {a.address.split("%")[0]: name for items in addresses.values() for a in items
            if a.family in (socket.AF_INET, socket.AF_INET6) and not a.address.startswith(("127.", "::1"))}


def ownership(report: RasReport, job_pids: Iterable[int]) -> str | None:
    """None when the report is this job's (it names one of the job's rank PIDs); else a note
    saying whose it is. A text report that names no process at all cannot be checked: None."""
    named = report.pids()
    if not named or named & set(job_pids):
        return None
    shown = ", ".join(str(p) for p in sorted(named)[:6]) + (", ..." if len(named) > 6 else "")
    return (f"NCCL RAS answered for another job on this node (its processes {shown} are not this job's ranks; "
            "or trainwatch sees the job in another PID namespace); the port is shared, a later poll may reach "
            "this job's")


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

    def rest(self, limit: int, deadline: float) -> bytes:
        chunks, size = [self._buffer], len(self._buffer)
        while size < limit:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._conn.settimeout(left)
            try:
                data = self._conn.recv(256 * 1024)
            except socket.timeout:
                break  # what came so far is kept; the report is labelled partial by its parser
            if not data:
                break
            chunks.append(data)
            size += len(data)
        return b"".join(chunks)[:limit]


def _send(conn: socket.socket, text: str) -> int:
    data = text.encode()
    conn.sendall(data)
    return len(data)
