"""Run ``py-spy dump --json`` on one process, bounded, and never leave the target stopped."""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Literal, overload

from ...errors import AccessDenied, NoSuchProcess, ToolMissing, TrainwatchError
from ...frames import wanted_names
from ...observed import FrameInts
from ..processes import namespaces, procfs
from ...snapshot import Frame, ThreadStack

DEFAULT_TIMEOUT = 5.0
# A native dump first loads the symbols of every shared object (libtorch's are hundreds of MB): 1.3 s
# for a CPU torch rank on a quiet 2-core machine, 3-4 s beside seven busy processes; 5 s cut it off.
NATIVE_TIMEOUT = 12.0
INT_LITERAL = re.compile(r"-?\d{1,18}")  # py-spy prints ints in decimal ("+bigint" beyond 64 bits)
CAP_SYS_PTRACE = 19
BACKTRACE_LINE = re.compile(r"^\d+:\s")  # a frame of the Rust backtrace py-spy prints with its error


class RankGone(NoSuchProcess):
    """The process exited while it was being sampled."""


class PySpyTimeout(TrainwatchError):
    """py-spy did not answer in time (a pausing attach on a process that will not stop, say)."""


_FOUND: dict[tuple[str | None, str | None], str] = {}  # (TRAINWATCH_PYSPY, PATH) -> the binary


def find_pyspy() -> str:
    """$TRAINWATCH_PYSPY, py-spy on PATH, or next to this interpreter (a venv without activation).
    Looked up once per setting (a search of PATH per rank cost more than reading the rank): a
    binary removed since fails to start, and that rank says so."""
    key = (os.environ.get("TRAINWATCH_PYSPY"), os.environ.get("PATH"))
    if key not in _FOUND:
        _FOUND[key] = _search_pyspy()
    return _FOUND[key]


def _search_pyspy() -> str:
    override = os.environ.get("TRAINWATCH_PYSPY")
    if override:
        if not os.access(override, os.X_OK):
            raise ToolMissing(f"py-spy is not installed at TRAINWATCH_PYSPY={override}",
                              "pip install py-spy, or point TRAINWATCH_PYSPY at its binary")
        return override
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if not found:
        raise ToolMissing("py-spy is not installed", "pip install py-spy (it ships with trainwatch's dependencies)")
    return found


@overload
def dump_stacks(pid: int, native: bool = ..., timeout: float = ...,
                locals: Literal[False] = ..., nonblocking: bool = ...,
                wanted: Callable[[Frame], frozenset[str]] = ...) -> list[ThreadStack]: ...
@overload
def dump_stacks(pid: int, native: bool = ..., timeout: float = ..., *,
                locals: Literal[True], nonblocking: bool = ...,
                wanted: Callable[[Frame], frozenset[str]] = ...) -> tuple[list[ThreadStack], FrameInts]: ...


def dump_stacks(pid: int, native: bool = False, timeout: float = DEFAULT_TIMEOUT, locals: bool = False,
                nonblocking: bool = False, wanted: Callable[[Frame], frozenset[str]] = wanted_names,
                ) -> list[ThreadStack] | tuple[list[ThreadStack], FrameInts]:
    """All threads' stacks of ``pid``, innermost frame first. Raises TrainwatchError subclasses.

    ``locals=True`` (not with ``native``) adds ``--locals`` and returns ``(stacks, ints)``: the main
    thread's step-like integer locals (:func:`parse_locals`); every other local is dropped.
    ``wanted``: which names of which frame to keep instead (a rank's number: ``frames.rank_names``).
    ``nonblocking``: read the process's memory without pausing it (``--nonblocking``: no ptrace
    stop, so no interrupted syscall; reads ``/proc/PID/mem``, which works where ptrace is denied
    or already taken by a debugger); native frames need the pause and are not asked for."""
    run = PySpyRun(pid, native=native, timeout=timeout, locals=locals, nonblocking=nonblocking, wanted=wanted)
    while not run.ended:
        wait_any([run])
    stacks, ints = run.result()
    return (stacks, ints) if locals else stacks


class PySpyRun:
    """One ``py-spy dump --json`` under way: started here, its pipes read by :func:`wait_any`
    (many runs from one thread: no thread per rank), then read by :meth:`result`."""

    def __init__(self, pid: int, native: bool = False, timeout: float = DEFAULT_TIMEOUT, locals: bool = False,
                 nonblocking: bool = False, wanted: Callable[[Frame], frozenset[str]] = wanted_names) -> None:
        cmd = [find_pyspy(), "dump", "--json", "--pid", str(pid)]
        if nonblocking:
            cmd.append("--nonblocking")
        elif native:
            cmd.append("--native")
        if locals:
            cmd.append("--locals")
        self.pid, self.locals, self.timeout, self.wanted = pid, locals, timeout, wanted
        self.was_stopped = procfs.state_letter(pid) in ("T", "t")
        self.started = time.time()
        self.deadline = time.monotonic() + timeout
        self.ended: float | None = None  # unix time it ended (or was given up on)
        self.timed_out = False
        self._returncode: int | None = None
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:  # no processes or memory left to start it: this rank goes unread
            self._proc, self._failed = None, f"py-spy could not be started for PID {pid}: {exc}"
            self.ended = time.time()
            return
        self._failed = ""
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._out, self._err = self._proc.stdout.fileno(), self._proc.stderr.fileno()
        self._chunks: dict[int, list[bytes]] = {self._out: [], self._err: []}
        self._open = {self._out: self._proc.stdout, self._err: self._proc.stderr}

    def pipes(self) -> list:
        """The pipes still open (py-spy has more to say)."""
        return list(self._open.values())

    def read(self, fd: int) -> bool:
        """Take what py-spy wrote to pipe ``fd``; False at its end (then :meth:`close` it)."""
        chunk = os.read(fd, 65536)
        self._chunks[fd].append(chunk)
        return bool(chunk)

    def close(self, fd: int) -> None:
        """Pipe ``fd`` is at its end; when both are, py-spy is exiting: reap it."""
        self._open.pop(fd).close()
        if not self._open and self._proc is not None:
            try:
                self._returncode = self._proc.wait(timeout=max(0.1, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.give_up()
                return
            self._finish()

    def give_up(self) -> None:
        """Its time is up: stop py-spy, and resume the target if py-spy left it stopped."""
        if self._proc is None or self.ended:
            return
        self._proc.kill()
        self._proc.wait()
        for pipe in self._open.values():
            pipe.close()
        self._open.clear()
        self.timed_out = True
        self._finish()

    def _finish(self) -> None:
        self.ended = time.time()
        _resume_if_we_stopped(self.pid, self.was_stopped)

    def result(self) -> tuple[list[ThreadStack], FrameInts | None]:
        """The stacks (and with ``locals`` the step-like ints); raises TrainwatchError subclasses."""
        if self._failed:
            raise TrainwatchError(self._failed)
        if self.timed_out:
            raise PySpyTimeout(f"py-spy did not answer within {self.timeout:.0f}s for PID {self.pid}")
        stdout, stderr = (b"".join(self._chunks[fd]).decode("utf-8", "replace") for fd in (self._out, self._err))
        if self._returncode != 0:  # with locals, stdout may hold the job's values: explain from stderr only
            raise _explain_failure(self.pid, stderr if self.locals else (stderr or stdout))
        try:
            data = json.loads(stdout)
            stacks = parse_dump(data, self.pid)
            return stacks, (parse_locals(data, self.pid, self.wanted) if self.locals else None)
        except (json.JSONDecodeError, TypeError, KeyError, AttributeError) as exc:
            detail = type(exc).__name__ if self.locals else exc  # never echo a local's value
            raise TrainwatchError(f"py-spy printed something unreadable for PID {self.pid}: {detail}") from None


def wait_any(runs: list[PySpyRun]) -> list[PySpyRun]:
    """Read the runs' pipes until at least one run has ended (py-spy exited, or its time ran out and
    it was stopped); those that ended."""
    ended = [run for run in runs if run.ended]
    with selectors.DefaultSelector() as selector:
        for run in runs:
            for pipe in run.pipes():
                selector.register(pipe, selectors.EVENT_READ, run)
        while not ended:
            soonest = min(run.deadline for run in runs)
            for key, _ in selector.select(max(0.0, soonest - time.monotonic())):
                if not key.data.read(key.fd):
                    selector.unregister(key.fileobj)
                    key.data.close(key.fd)
            now = time.monotonic()
            for run in runs:
                if not run.ended and now >= run.deadline:
                    for pipe in run.pipes():
                        selector.unregister(pipe)
                    run.give_up()
            ended = [run for run in runs if run.ended]
    return ended


def _resume_if_we_stopped(pid: int, was_stopped: bool) -> None:
    # A py-spy killed mid-attach can leave its SIGSTOP pending; SIGCONT only undoes our own stop.
    if not was_stopped and procfs.state_letter(pid) in ("T", "t"):
        time.sleep(0.05)
        if procfs.state_letter(pid) == "T":
            os.kill(pid, signal.SIGCONT)


def parse_dump(data: list[dict], pid: int) -> list[ThreadStack]:
    """py-spy's JSON (a list of threads) as ThreadStacks, main thread first."""
    threads = []
    # Threads named by their IDs in the rank's own PID namespace (a container's): ours here.
    tids = namespaces.tids_here(pid, [item.get("os_thread_id") for item in data])
    for item, tid in zip(data, tids):
        frames = tuple(
            Frame(
                function=f.get("name") or "?",
                file=f.get("filename") or "?",
                line=f.get("line") or None,
                native=f.get("module") is not None,  # py-spy names the shared object of native frames
            )
            for f in item.get("frames", [])
        )
        threads.append(ThreadStack(
            name=item.get("thread_name") or f"thread {tid}",
            tid=tid,
            frames=frames,
            active=item.get("active"),
            owns_gil=item.get("owns_gil"),
            is_main=tid == pid,
        ))
    threads.sort(key=lambda t: not t.is_main)
    return threads


def parse_locals(data: list[dict], pid: int,
                 wanted_in: Callable[[Frame], frozenset[str]] = wanted_names) -> FrameInts:
    """The main thread's allowed integer locals, by frame index (innermost 0): only names
    ``wanted_in`` (:func:`frames.wanted_names`: step-like ones) allows for that frame, only int
    literals; nothing else is kept."""
    tids = namespaces.tids_here(pid, [item.get("os_thread_id") for item in data])
    main = next((item for item, tid in zip(data, tids) if tid == pid), data[0] if data else None)
    out: FrameInts = {}
    for index, raw in enumerate(main.get("frames", []) if main else []):
        wanted = wanted_in(Frame(function=raw.get("name") or "?", file=raw.get("filename") or "?",
                                    native=raw.get("module") is not None))
        if not wanted:
            continue
        found = {}
        for local in raw.get("locals") or ():
            value = int_literal(local.get("repr")) if local.get("name") in wanted else None
            if value is not None:
                found[local["name"]] = value
        if found:
            out[index] = found
    return out


def int_literal(text: object) -> int | None:
    """``text`` as an int when it is exactly a decimal integer literal (so never a bool, a float
    or a string), else None."""
    if isinstance(text, str) and INT_LITERAL.fullmatch(text):
        return int(text)
    return None


def error_line(message: str) -> str:
    """py-spy's own error line (``Error: Permission denied (os error 13)``), not the last line of
    the Rust backtrace it may print after it (``9: main``)."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    for line in lines:
        if line.startswith("Error:") or line.lower().startswith("error:"):
            return line
    plain = [line for line in lines if not BACKTRACE_LINE.match(line) and not line.startswith("at ")
             and "Stack backtrace" not in line]
    return plain[0] if plain else (lines[-1] if lines else "no output")


def _explain_failure(pid: int, message: str) -> TrainwatchError:
    text = error_line(message)
    lowered = message.lower()
    if procfs.state_letter(pid) in (None, "Z", "X") or "no such process" in lowered:
        return RankGone(f"PID {pid} exited while it was being sampled")
    tracer = tracer_of(pid)
    if tracer is not None:
        return AccessDenied(f"py-spy may not pause PID {pid}: it is traced by {tracer}", "read without pausing")
    if "permission denied" in lowered or "operation not permitted" in lowered:
        return AccessDenied(f"py-spy may not read PID {pid}: {text}", ptrace_remedy(pid))
    if "version" in lowered and ("python" in lowered or "unsupported" in lowered):
        return ToolMissing(f"py-spy cannot read PID {pid}'s Python: {text}", "pip install --upgrade py-spy")
    return TrainwatchError(f"py-spy failed on PID {pid}: {text}")


def tracer_of(pid: int) -> str | None:
    """``gdb (PID 812)`` when another process traces ``pid`` (``TracerPid`` in its status)."""
    field = procfs.status_field(pid, "TracerPid") or "0"
    if not field.isdigit() or field == "0":
        return None
    name = (procfs.read_text(f"/proc/{field}/comm") or "?").strip()
    return f"{name} (PID {field})"


def ptrace_remedy(pid: int) -> str:
    """Why reading another process's memory is refused here, and what to do about it."""
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        owner = None
    if os.geteuid() != 0 and owner is not None and owner != os.geteuid():
        return f"the job runs as uid {owner}; run trainwatch as that user or with sudo"
    eff = int(procfs.status_fields(os.getpid()).get("CapEff", "0").strip() or "0", 16)
    target_caps = int(procfs.status_fields(pid).get("CapEff", "0").strip() or "0", 16)
    if target_caps & ~eff:
        return (f"PID {pid} holds capabilities trainwatch lacks (it runs more privileged, e.g. a container's "
                "init or another container's process), so the kernel refuses access even to root; "
                "run trainwatch in the job's own container or with the same privileges")
    if os.geteuid() == 0 and not eff & (1 << CAP_SYS_PTRACE):
        return ("this container lacks CAP_SYS_PTRACE: run it with --cap-add SYS_PTRACE (docker) "
                "or add SYS_PTRACE to the pod's securityContext")
    if owner in (None, os.geteuid()) or os.geteuid() == 0:
        return ("no ptrace permission although the user matches (a container without SYS_PTRACE, or a "
                "seccomp filter that denies ptrace): trainwatch reads without pausing instead")
    scope = (procfs.read_text("/proc/sys/kernel/yama/ptrace_scope") or "0").strip()
    if scope != "0" and os.geteuid() != 0:
        return (f"kernel.yama.ptrace_scope is {scope}: run trainwatch with sudo, or "
                "`sudo sysctl kernel.yama.ptrace_scope=0`")
    return "run trainwatch as the job's user or as root"
