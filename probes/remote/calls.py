"""One bounded call on another node and why it failed: every call has a timeout, and on
timeout the whole process group of the ssh/srun/kubectl child is killed."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass

from ..process_group import kill_groups
from .reach import Remote, SshRemote

STDERR_KEEP = 4000  # bytes of a node call's stderr kept for its error message


@dataclass
class Result:
    """What a remote command did."""

    returncode: int | None  # None when killed on timeout
    stdout: bytes = b""
    stderr: str = ""
    timed_out: bool = False
    elapsed_s: float = 0.0
    start_error: str | None = None  # the local ssh/srun/kubectl could not start


class Runner:
    """Runs remote commands with a timeout and can kill every one still running (``close``)."""

    def __init__(self) -> None:
        self._live: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self.closed = False

    def run(self, argv: list[str], timeout: float, stdout_path: str | None = None) -> Result:
        """Run ``argv`` in its own session; on timeout kill the group (TERM, then KILL)."""
        started = time.monotonic()
        out = open(stdout_path, "wb") if stdout_path else subprocess.PIPE
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            if stdout_path:
                out.close()
            return Result(None, start_error=f"cannot run {argv[0]}: {exc.strerror or exc}")
        with self._lock:
            if self.closed:
                kill_groups([proc])
            self._live.add(proc)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_groups([proc])
            stdout, stderr = proc.communicate()
            timed_out = True
        finally:
            with self._lock:
                self._live.discard(proc)
            if stdout_path:
                out.close()
        return Result(None if timed_out else proc.returncode, stdout or b"",
                      (stderr or b"").decode(errors="replace")[-STDERR_KEEP:], timed_out,
                      time.monotonic() - started)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            live = list(self._live)
        for proc in live:
            kill_groups([proc])


def _last_message(stderr: str) -> str:
    """The most telling stderr line: trainwatch's own message, else the last non-empty line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("trainwatch:")]
    if ours:
        return ours[-1].removeprefix("trainwatch:").strip()
    return lines[-1] if lines else ""


_NOT_INSTALLED = ("command not found", "executable file not found", "execve()", "not found in $path")


def classify_failure(remote: Remote, result: Result, timeout: float) -> str:
    """One short reason a person can act on, naming the cause."""
    if result.start_error:
        return result.start_error
    if result.timed_out:
        return f"timeout: no answer in {timeout:g}s"
    rc, message = result.returncode, _last_message(result.stderr)
    low = result.stderr.lower()
    detail = f" ({message})" if message else ""
    if isinstance(remote, SshRemote) and rc == 255:
        if "permission denied" in low:
            return f"permission denied by ssh{detail}"
        if "host key verification failed" in low:
            return f"unreachable: host key verification failed{detail}"
        return f"unreachable{detail}"
    if rc == 127 or any(marker in low for marker in _NOT_INSTALLED) or (
            "no such file or directory" in low and "trainwatch:" not in low):
        return f"trainwatch not installed there (or not on PATH; see --remote-trainwatch){detail}"
    if rc == 126:
        return f"permission denied running trainwatch there{detail}"
    if rc in (3, 4):  # NoSuchProcess / NotAJob from the remote trainwatch
        return f"no job found there{detail}"
    if rc == 5:
        return f"permission denied{detail}"
    if rc == 6:
        return f"probe tool missing there{detail}"
    return f"failed with exit status {rc}{detail}"
