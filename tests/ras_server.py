"""A stand-in NCCL RAS service on loopback: the NCCL-boundary fake for tests and benches.

It speaks the client protocol the way NCCL's server does (NVIDIA/nccl src/ras/client_support.cc,
rasClientEventLoop, v2.29.2): commands are lines, case-insensitive, ``\\r`` tolerated;
``CLIENT PROTOCOL n`` -> ``SERVER PROTOCOL 2``; ``TIMEOUT n`` -> ``OK`` or ``ERROR: Invalid
timeout value``; ``SET FORMAT text|json`` -> ``OK`` (``ERROR: Unknown command`` on a server that
predates JSON, as NCCL < 2.28.7 answers); ``STATUS`` / ``VERBOSE STATUS`` -> the report, then
the connection is closed; anything else -> ``ERROR: Unknown command <cmd>``.

``reports`` is a list of takes, each ``{"text": ..., "json": ...}``: each STATUS query answers
with the next take (the last one repeats), so two polls see a job move on or not.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "ras"


def takes(name: str) -> list[dict[str, str]]:
    """The fixture takes of a scenario: ``synthetic-<name>-a/-b`` or the single ``synthetic-<name>``."""
    found = []
    for suffix in ("-a", "-b", ""):
        text, js = FIXTURES / f"synthetic-{name}{suffix}.txt", FIXTURES / f"synthetic-{name}{suffix}.json"
        if text.exists() or js.exists():
            found.append({"text": text.read_text() if text.exists() else "",
                          "json": js.read_text() if js.exists() else ""})
    if not found:
        raise FileNotFoundError(f"no RAS fixture named {name}")
    return found


class RasServer:
    """Serves connections one at a time in a thread until :meth:`close`; use as a context manager."""

    def __init__(self, reports: list[dict[str, str]], *, json_supported: bool = True, silent: bool = False,
                 delay: float = 0.0, host: str = "127.0.0.1", head_first: bool = False,
                 stop_after_head: bool = False, threaded: bool = False) -> None:
        self.reports = reports
        self.json_supported = json_supported
        self.silent = silent  # accept, never answer: a hung service
        self.delay = delay  # before sending a report (after its head, with head_first): RAS gathering from slow peers
        # As NCCL's server does: the header up to the "Communicators..." line at once, the rest when its
        # collective ends; stop_after_head: the rest never comes (the connection stays open until close()).
        self.head_first = head_first or stop_after_head
        self.stop_after_head = stop_after_head
        self.threaded = threaded  # each connection in its own thread: two clients at once are served at once
        self.active = 0
        self.max_active = 0  # most STATUS queries in progress at one time
        self.commands: list[str] = []
        self.queries = 0
        self._stop = threading.Event()
        self._count = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def __enter__(self) -> RasServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if self.threaded:
                threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()
            else:
                self._serve_one(conn)

    def _serve_one(self, conn: socket.socket) -> None:
        with conn:
            try:
                self._client(conn)
            except OSError:
                pass

    def _client(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        fmt, buffer = "text", b""
        while not self._stop.is_set():
            if b"\n" not in buffer:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                buffer += chunk
                continue
            raw, _, buffer = buffer.partition(b"\n")
            cmd = raw.decode().rstrip("\r")
            self.commands.append(cmd)
            if self.silent:
                self._stop.wait(30)
                return
            low = cmd.lower()
            if low.startswith("client protocol "):
                conn.sendall(b"SERVER PROTOCOL 2\n")
            elif low.startswith("timeout "):
                value = cmd[len("timeout "):]
                conn.sendall(b"OK\n" if value.isdigit() else f"ERROR: Invalid timeout value {value}\n".encode())
            elif low.startswith("set format ") and self.json_supported:
                wanted = low[len("set format "):]
                if wanted in ("text", "json"):
                    fmt = wanted
                    conn.sendall(b"OK\n")
                else:
                    conn.sendall(f"ERROR: Invalid format {cmd[len('set format '):]}\n".encode())
            elif low in ("status", "verbose status"):
                with self._count:
                    take = self.reports[min(self.queries, len(self.reports) - 1)]
                    self.queries += 1
                    self.active += 1
                    self.max_active = max(self.max_active, self.active)
                try:
                    self._report(conn, take, fmt)
                finally:
                    with self._count:
                        self.active -= 1
                return  # the server closes once the report is out
            else:
                conn.sendall(f"ERROR: Unknown command {cmd}\n".encode())

    def _report(self, conn: socket.socket, take: dict[str, str], fmt: str) -> None:
        body = take[fmt].encode()
        if self.head_first:
            cut = body.find(b"\n", body.find(b"Communicators") + 1) + 1 if b"Communicators" in body else 0
            conn.sendall(body[:cut])
            body = body[cut:]
            if self.stop_after_head:  # until the client gives up (or close())
                conn.settimeout(0.2)
                while not self._stop.is_set():
                    try:
                        if not conn.recv(1):
                            return
                    except socket.timeout:
                        continue
                return
        if self.delay:
            time.sleep(self.delay)
        conn.sendall(body)


def json_report(members: list[tuple[int, str, int]], allreduce: dict[int, int], comm: str = "0x5eed") -> str:
    """A one-communicator JSON report in NCCL's layout for live jobs whose PIDs a test only learns
    once they run: ``members`` (rank, host, pid), each rank's AllReduce count."""
    ranks = [{"rank": rank, "host": host, "pid": pid, "cuda_dev": rank, "nvml_dev": rank,
              "status": {"init_state": 0, "async_error": 0, "finalize_called": False, "destroy_flag": False,
                         "abort_flag": False},
              "collective_counts": {"Broadcast": 1, "Reduce": 0, "AllGather": 0, "ReduceScatter": 0,
                                    "AllReduce": allreduce[rank]}} for rank, host, pid in members]
    return json.dumps({"nccl_version": "2.29.7", "cuda_runtime_version": 13000, "cuda_driver_version": 13000,
                       "timestamp": "2026-11-23 14:00:00", "communicators_count": 1,
                       "communicators": [{"hash": comm, "secondary_hash": "0x1:0x2", "size": len(members),
                                          "ranks_count": len(members), "missing_ranks_count": 0, "ranks": ranks,
                                          "missing_ranks": []}],
                       "ras": {"collection_time_sec": 0.001, "timeouts_count": 0}}, indent=2) + "\n"
