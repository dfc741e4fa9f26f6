"""Talk to the hook of armed ranks: find their control sockets and ask for evidence.

Used by the evidence bundle and ``trainwatch watch``; every failure comes back as a
:class:`HookReply` with ``ok=False`` and an ``error``, never as an exception.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path

from ... import rundir
from ...record import Record

COMMANDS = ("fr_trace", "stacks", "ping")
_MAX_REPLY = 256 * 1024 * 1024


@dataclass(frozen=True, repr=False)
class HookReply(Record):
    ok: bool
    text: str
    error: str | None


def armed_ranks(run_dir: Path) -> dict[int, Path]:
    """Rank -> control socket path, for every rank whose hook has a socket in ``run_dir``."""
    found: dict[int, Path] = {}
    for record in rundir.hook_records(run_dir):
        if record.get("socket") is None:
            continue
        sock = Path(record["socket"])
        if sock.exists():
            found[int(record["rank"])] = sock
    return found


def request(sock_path: Path, command: str, timeout: float = 5.0) -> HookReply:
    """Send one command (``fr_trace``, ``stacks`` or ``ping``) and wait for its reply."""
    if command not in COMMANDS:
        return HookReply(False, "", f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(sock_path))
            conn.sendall(command.encode() + b"\n")
            chunks = []
            size = 0
            while size < _MAX_REPLY:
                data = conn.recv(1 << 20)
                if not data:
                    break
                chunks.append(data)
                size += len(data)
    except socket.timeout:
        return HookReply(False, "", f"no reply from {sock_path} within {timeout:g}s")
    except OSError as exc:
        return HookReply(False, "", f"cannot reach hook at {sock_path}: {exc.strerror or exc}")
    try:
        reply = json.loads(b"".join(chunks))
        return HookReply(bool(reply["ok"]), str(reply.get("text") or ""), reply.get("error"))
    except (ValueError, KeyError, TypeError):
        return HookReply(False, "", f"unreadable reply from {sock_path}")


def faulthandler_signal(run_dir: Path) -> int | None:
    """The signal registered for faulthandler in this run, or None if none was recorded."""
    record = rundir.read_json(rundir.run_json(run_dir)) or {}
    value = (record.get("faulthandler") or {}).get("signal")
    if isinstance(value, int):
        return value
    for hook in rundir.hook_records(run_dir):  # armed by import
        value = hook.get("faulthandler_signal")
        if isinstance(value, int):
            return value
    return None


def faulthandler_file(run_dir: Path, rank: int) -> Path:
    return rundir.faulthandler_file(run_dir, rank)


def rank_log_file(run_dir: Path, rank: int) -> Path:
    return rundir.rank_log_file(run_dir, rank)
