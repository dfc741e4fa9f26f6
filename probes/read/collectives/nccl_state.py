"""What a rank offers about its collective (NCCL / Flight Recorder) state, each tried safely.

The ways in, used by the sources in ``read/collectives/sources/`` and by bundles:

1. Flight Recorder dumps already on disk: ``TORCH_FR_DUMP_TEMP_FILE`` /
   ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` + rank (torch's default prefix is
   ``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_``, i.e. ``~/.cache/torch/...``);
2. an on-demand dump through ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` + rank + ``.pipe`` (NCCL
   process groups only): one write to the FIFO, opened non-blocking, then up to
   ``PIPE_WAIT_S`` for the file (the dump symbolizes C++ stacks first: 5.7 s on an H100);
3. ``torch.distributed.debug`` worker servers, found under ``debug_server/rank<N>`` in the
   job's TCPStore (read in a subprocess, only when this interpreter has torch);
4. the ``NCCL_*`` / ``TORCH_NCCL_*`` / ``TORCH_FR_*`` / ``CUDA_*`` settings and the
   ``NCCL_DEBUG_FILE`` logs; a summary of NCCL RAS's text report (RAS itself: :mod:`.ras`).

Nothing here touches the TCPStore ``exception_dump`` key: it makes every rank abort.
Every function returns its result or a reason; none raises for a missing source.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..processes.rendezvous import STORE_READER_TAG
from ...record import Record


DEFAULT_FR_NAME = "comm_lib_trace_rank_"
SETTING_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_FR_", "CUDA_", "TORCH_DISTRIBUTED_DEBUG", "TORCH_CPP_LOG")
MAX_FILE_BYTES = 64 * 1024 * 1024
LOG_TAIL_BYTES = 1024 * 1024
# The debug-info pipe's dump took 5.7 s on an H100 (torch 2.11 symbolizes C++ stacks first).
PIPE_WAIT_S = 15.0


@dataclass(frozen=True, repr=False)
class Found(Record):
    """One piece of evidence: where it came from and its bytes (or why there is none)."""

    source: str
    data: bytes | None = None
    origin: str | None = None  # file path or URL
    note: str | None = None


def fr_prefixes(env: dict[str, str]) -> list[str]:
    """Flight Recorder dump prefixes the rank would write to, the default one last."""
    prefixes = [env[k] for k in ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE") if env.get(k)]
    cache = env.get("XDG_CACHE_HOME") or (str(Path(env["HOME"], ".cache")) if env.get("HOME") else None)
    if cache:
        prefixes.append(str(Path(cache, "torch", DEFAULT_FR_NAME)))
    return list(dict.fromkeys(prefixes))


def read_capped(path: Path, limit: int = MAX_FILE_BYTES, tail: bool = False) -> bytes:
    """At most ``limit`` bytes of a file: the start, or the end with ``tail``."""
    with open(path, "rb") as handle:
        if tail:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - limit))
        return handle.read(limit)


def fr_files_on_disk(rank: int, env: dict[str, str], since: float = 0.0) -> list[Found]:
    """Existing dumps for this rank (newer than ``since``), or one note saying where none was."""
    found, looked, unreadable = [], [], []
    for prefix in fr_prefixes(env):
        path = Path(f"{prefix}{rank}")
        looked.append(str(path))
        try:
            if path.stat().st_mtime < since:
                continue
            found.append(Found("flight-recorder-file", read_capped(path), str(path)))
        except FileNotFoundError:
            continue  # no dump under this prefix: the note lists where we looked
        except OSError as exc:
            unreadable.append(f"{path}: {exc.strerror or exc}")
    if found:
        return found
    why = f"; unreadable: {'; '.join(unreadable)}" if unreadable else ""
    return [Found("flight-recorder-file",
                  note=f"no Flight Recorder dump on disk (looked at {', '.join(looked)}){why}")]


def pipe_path(rank: int, env: dict[str, str]) -> Path | None:
    base = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE") or env.get("TORCH_FR_DEBUG_INFO_PIPE_FILE")
    return Path(f"{base}{rank}.pipe") if base else None


def trigger_pipe(path: Path) -> str | None:
    """Ask the rank's watchdog for a dump by writing to its FIFO. Returns why not, or None when sent."""
    try:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            return f"{path} is not a named pipe"
    except OSError:
        return f"no pipe at {path} (only NCCL process groups create it)"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return f"nobody reads {path} (the rank's watchdog is not listening)"
        return f"cannot open {path}: {exc.strerror}"
    try:
        os.write(fd, b"1\n")
    except OSError as exc:
        return f"cannot write to {path}: {exc.strerror}"
    finally:
        os.close(fd)
    return None


def dump_through_pipe(rank: int, env: dict[str, str], wait_s: float = PIPE_WAIT_S,
                      stop: threading.Event | None = None,
                      accept: Callable[[bytes], bool] = bool) -> Found:
    """Trigger a dump through the pipe and collect the file it writes (bounded wait)."""
    path = pipe_path(rank, env)
    if path is None:
        return Found("pipe", note="TORCH_NCCL_DEBUG_INFO_PIPE_FILE not set")
    started = time.time()
    why = trigger_pipe(path)
    if why:
        return Found("pipe", note=why)
    return await_dump(rank, env, started, wait_s, stop, accept, origin=str(path))


def await_dump(rank: int, env: dict[str, str], since: float, wait_s: float,
               stop: threading.Event | None = None, accept: Callable[[bytes], bool] = bool,
               origin: str = "the pipe") -> Found:
    """Wait up to ``wait_s`` for a dump file newer than ``since`` that has stopped changing and
    that ``accept`` takes (torch writes it in place, not atomically); ``stop`` ends the wait."""
    stop = stop or threading.Event()
    deadline = time.monotonic() + wait_s
    last: bytes | None = None
    while time.monotonic() < deadline and not stop.is_set():
        fresh = [f for f in fr_files_on_disk(rank, env, since=since - 0.5) if f.data]
        if fresh and fresh[0].data == last and accept(last):
            return Found("pipe", fresh[0].data, fresh[0].origin)
        last = fresh[0].data if fresh else None
        stop.wait(0.2)
    why = "stopped waiting" if stop.is_set() else f"no complete dump appeared within {wait_s:g}s"
    return Found("pipe", note=f"wrote to {origin} but {why}")


_STORE_SCRIPT = r"""
import datetime, json, sys
import torch.distributed as dist
host, port, ranks, timeout = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), float(sys.argv[4])
store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout),
                      wait_for_workers=False)
store = dist.PrefixStore("debug_server", store)
found = {}
for rank in ranks:
    key = f"rank{rank}"
    if store.check([key]):
        found[rank] = store.get(key).decode()
print(json.dumps(found))
"""


def debug_server_urls(master_addr: str | None, master_port: int | None, ranks: list[int],
                      timeout: float = 3.0) -> tuple[dict[int, str], str | None]:
    """rank -> worker URL from ``debug_server/rank<N>`` in the job's TCPStore, or why not."""
    if not master_addr or not master_port:
        return {}, "no MASTER_ADDR/MASTER_PORT: no TCPStore to ask for torch.distributed.debug servers"
    if importlib.util.find_spec("torch") is None:
        return {}, "torch is not importable by trainwatch: torch.distributed.debug servers not queried"
    cmd = [sys.executable, "-c", _STORE_SCRIPT, master_addr, str(master_port), json.dumps(ranks), str(timeout),
           STORE_READER_TAG]  # so discovery never takes this reader for a rank of the job
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 20)
    except subprocess.TimeoutExpired:
        return {}, f"the job's TCPStore at {master_addr}:{master_port} did not answer in time"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {}, f"cannot read the job's TCPStore at {master_addr}:{master_port}: {last[:200]}"
    try:
        urls = {int(k): str(v) for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
    except (ValueError, IndexError):
        return {}, "unreadable answer from the TCPStore reader"
    if not urls:
        return {}, "the job did not start torch.distributed.debug servers (no debug_server/rank<N> keys)"
    return urls, None


def fetch_debug_handler(url: str, handler: str, timeout: float = 5.0) -> Found:
    """POST ``<url>/handler/<handler>`` of a torch.distributed.debug worker server."""
    import urllib.error  # here: loading urllib costs every command's start-up ~13 ms
    import urllib.request

    full = f"{url.rstrip('/')}/handler/{handler}"
    try:
        with urllib.request.urlopen(urllib.request.Request(full, data=b"", method="POST"), timeout=timeout) as resp:
            return Found("debug-server", resp.read(MAX_FILE_BYTES), full)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return Found("debug-server", origin=full, note=f"{full}: {getattr(exc, 'reason', exc)}")


def summarize_ras(text: str, limit: int = 40) -> list[str]:
    """The lines of a RAS text report worth reading first: its Errors and Warnings sections (what
    NCCL found wrong, with the processes it names); a report without them, its notable lines."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip() and not set(line.strip()) <= {"="}]
    start = next((i for i, line in enumerate(lines) if line.strip() == "Errors"), None)
    if start is not None:
        problems = [line for line in lines[start:] if line.strip() not in ("Errors", "Warnings")]
        return (problems or ["no errors or warnings"])[:limit]
    keys = ("error", "warn", "missing", "unresponsive", "dead", "mismatch", "not ", "timeout")
    notable = [line.strip() for line in lines if any(k in line.lower() for k in keys)]
    return (notable or [line.strip() for line in lines])[:limit]


def settings(env: dict[str, str]) -> dict[str, str]:
    """The rank's NCCL / torch-distributed / CUDA settings (redaction happens when written)."""
    return {k: v for k, v in sorted(env.items()) if k.startswith(SETTING_PREFIXES)}


def nccl_debug_files(env: dict[str, str], pid: int, host: str) -> list[Found]:
    """The tails of the log files named by ``NCCL_DEBUG_FILE`` (``%h`` host, ``%p`` pid)."""
    pattern = env.get("NCCL_DEBUG_FILE")
    if not pattern:
        return []
    path = Path(pattern.replace("%h", host).replace("%p", str(pid)))
    try:
        return [Found("nccl-debug-file", read_capped(path, LOG_TAIL_BYTES, tail=True), str(path))]
    except OSError as exc:
        return [Found("nccl-debug-file", origin=str(path), note=f"NCCL_DEBUG_FILE {path}: {exc.strerror}")]
