"""The run directory of an armed job: where every file lives, and the environment that arms ranks.

Layout (``<run>`` is ``trainwatch run --out``)::

    <run>/run.json                  command, start time, host, armed settings
    <run>/launcher.log              the launcher's output (only with ``--attach``)
    <run>/launcher-exit.json        the launcher's pid and wait status, once it ended
    <run>/ranks/<rank>/hook.json    written by the hook: pid, control socket, files
    <run>/ranks/<rank>/control.sock the hook's control channel (owner-only)
    <run>/ranks/<rank>/faulthandler.log   fatal-signal and on-demand traces (appended)
    <run>/ranks/<rank>/output.log   the rank's stdout and stderr (appended)
    <run>/ranks/<rank>/exit.json    the uncaught exception that ended the rank, if any
    <run>/ranks/<rank>/last-words.json    stacks and Flight Recorder at SIGTERM, SIGINT or an
                                    uncaught exception (once per rank; see the hook)
    <run>/ranks/<rank>/last-words.log     every thread's stack, written by faulthandler the moment
                                    SIGTERM or SIGINT arrives (empty until one does)
    <run>/flight/                   Flight Recorder dumps (on timeout, or via the pipe)

Only the standard library is used: the hook loads this logic inside user processes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

# A real-time signal: SIGUSR1/SIGUSR2 are taken by SLURM, Lightning and torchrun's
# ``--signals-to-handle``; nothing in torch or the launchers uses SIGRTMIN+3.
FAULTHANDLER_SIGNAL = int(signal.SIGRTMIN) + 3
FR_BUFFER_ENTRIES = "2000"

HOOK_DIR = Path(__file__).resolve().parent / "hook" / "armed"


def rank_dir(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "ranks" / str(rank)


def run_json(run_dir: Path) -> Path:
    return Path(run_dir) / "run.json"


def hook_json(run_dir: Path, rank: int) -> Path:
    return rank_dir(run_dir, rank) / "hook.json"


def control_socket(run_dir: Path, rank: int) -> Path:
    """The preferred socket path; the hook falls back to a short one (see hook.json)."""
    return rank_dir(run_dir, rank) / "control.sock"


def faulthandler_file(run_dir: Path, rank: int) -> Path:
    return rank_dir(run_dir, rank) / "faulthandler.log"


def rank_log_file(run_dir: Path, rank: int) -> Path:
    return rank_dir(run_dir, rank) / "output.log"


def exit_file(run_dir: Path, rank: int) -> Path:
    return rank_dir(run_dir, rank) / "exit.json"


def last_words_file(run_dir: Path, rank: int) -> Path:
    """The rank's last words: stacks and Flight Recorder as it was told to stop, or raised."""
    return rank_dir(run_dir, rank) / "last-words.json"


def last_words_log(run_dir: Path, rank: int) -> Path:
    """faulthandler's all-thread trace at SIGTERM/SIGINT, from its C handler (even while the main
    thread is blocked in C++); appended, one trace per signal."""
    return rank_dir(run_dir, rank) / "last-words.log"


def launcher_exit_file(run_dir: Path) -> Path:
    """Written by ``trainwatch run`` when the command it started ends: its pid and wait status."""
    return Path(run_dir) / "launcher-exit.json"


def flight_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "flight"


def runtime_dir() -> Path:
    """trainwatch's own folder for small files that live while it runs and that the trainwatch
    processes of this user on this node share (NCCL RAS query locks, a rank's last dump, what each
    established of a rank's stillness):
    ``$XDG_RUNTIME_DIR/trainwatch``, else ``/tmp/trainwatch-<uid>``; made owner-only (0700).
    Raises OSError when it cannot be made, or is not this user's own folder."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "trainwatch" if runtime and os.path.isdir(runtime) else \
        Path(tempfile.gettempdir()) / f"trainwatch-{os.getuid()}"
    try:
        base.mkdir(mode=0o700)
    except FileExistsError:
        pass  # looked at below: it must be ours
    info = os.lstat(base)
    if not os.path.isdir(base) or os.path.islink(base) or info.st_uid != os.getuid():
        raise PermissionError(f"{base} is not a folder of this user's own")
    if info.st_mode & 0o077:
        os.chmod(base, 0o700)
    return base


def implicit_run_dir(uid: int, launcher_pid: int) -> Path:
    """Where a rank armed by ``import trainwatch.probes.hook`` (no ``trainwatch run``) keeps its
    evidence: one directory per launcher, shared by its local ranks."""
    return Path(tempfile.gettempdir()) / f"trainwatch-{uid}" / f"job-{launcher_pid}"


def default_run_dir(base: Path | None = None) -> Path:
    """``./trainwatch-runs/<YYYYmmdd-HHMMSS>-<pid>``: next to the job, easy to find later."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(base or Path.cwd()) / "trainwatch-runs" / f"{stamp}-{os.getpid()}"


def armed_env(run_dir: Path, base: dict[str, str],
              name_for: Callable[[str, str], str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """The environment for the job, and the settings trainwatch added (user values win).

    A setting torch renamed is given under one name only, ``name_for(new, old)`` (the one the job's
    torch reads: see ``torch_env``), and not at all when the user set either name: a torch that
    reads the new name warns on every rank when the old one is set."""
    run_dir = Path(run_dir).resolve()
    flight = flight_dir(run_dir)
    pick = name_for or (lambda new, old: new)
    wanted = {
        "TRAINWATCH_HOOK": "1",
        "TRAINWATCH_RUN_DIR": str(run_dir),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(flight / "pipe_rank_"),
    }
    renamed = {("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"): FR_BUFFER_ENTRIES,
               ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"): str(flight / "fr_trace_rank_")}
    for (new, old), value in renamed.items():
        if new not in base and old not in base:
            wanted[pick(new, old)] = value
    added = {k: v for k, v in wanted.items() if k not in base}
    env = {**base, **added}
    # The armed sitecustomize goes first; the user's PYTHONPATH follows unchanged.
    paths = [str(HOOK_DIR)] + [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env, added


def signal_name(number: int) -> str:
    """``SIGSEGV``; real-time signals as ``SIGRTMIN+3`` (Python has no names for them)."""
    rtmin = int(signal.SIGRTMIN)
    if rtmin < number <= int(signal.SIGRTMAX):
        return f"SIGRTMIN+{number - rtmin}"
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def write_run_json(run_dir: Path, command: list[str], added: dict[str, str], pid: int | None,
                   torch_version: str | None = None) -> dict:
    record = {
        "command": list(command),
        "started_at": time.time(),
        "host": socket.gethostname(),
        "trainwatch_pid": os.getpid(),
        "pid": pid,
        "python": sys.executable,
        "torch_version": torch_version,  # the job's, as its interpreter reported it
        "faulthandler": {"signal": FAULTHANDLER_SIGNAL, "signal_name": signal_name(FAULTHANDLER_SIGNAL),
                         "fatal": ["SIGSEGV", "SIGFPE", "SIGABRT", "SIGBUS", "SIGILL"]},
        "armed_env": added,
        "hook_dir": str(HOOK_DIR),
    }
    write_json(run_json(run_dir), record)
    return record


def read_json(path: Path) -> dict | None:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def hook_records(run_dir: Path) -> list[dict]:
    """Every rank's ``hook.json`` in ``run_dir`` (unreadable ones left out), in rank-folder order."""
    records = (read_json(path) for path in sorted(Path(run_dir).glob("ranks/*/hook.json")))
    return [record for record in records if record]


def write_json(path: Path, data: dict) -> None:
    """Write atomically so a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)
