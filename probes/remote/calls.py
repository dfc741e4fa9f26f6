"""Why a call on another node (an agent's ssh, srun or kubectl) failed, in words a person can act on."""

from __future__ import annotations

from dataclasses import dataclass

from .pods import forbidden, not_installed
from .reach import KubeRemote, Remote, SshRemote
from ..record import Record

STDERR_KEEP = 4000  # bytes of a node call's stderr kept for its error message


@dataclass(repr=False)
class Result(Record):
    """What a remote command did."""

    returncode: int | None  # None when killed on timeout
    stderr: str = ""
    timed_out: bool = False
    start_error: str | None = None  # the local ssh/srun/kubectl could not start


def _last_message(stderr: str) -> str:
    """The most telling stderr line: trainwatch's own message, else the last non-empty line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("trainwatch:")]
    if ours:
        return ours[-1].removeprefix("trainwatch:").strip()
    return lines[-1] if lines else ""


_NOT_INSTALLED = ("command not found", "executable file not found", "execve()", "not found in $path")


def classify_failure(remote: Remote, result: Result, timeout: float, trainwatch: str = "trainwatch") -> str:
    """One short reason a person can act on, naming the cause."""
    if result.start_error:
        return result.start_error
    if result.timed_out:
        return f"timeout: no answer in {timeout:g}s"
    rc, message = result.returncode, _last_message(result.stderr)
    low = result.stderr.lower()
    detail = f" ({message})" if message else ""
    if isinstance(remote, KubeRemote):  # kubectl's own words: a verb RBAC denies, an image without trainwatch
        denied = forbidden(result.stderr)
        if denied:
            return f"permission denied: {denied}"
        missing = not_installed(remote.name, result.stderr, trainwatch)
        if missing:
            return missing
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
