"""Stopping process groups trainwatch started itself (node agents, srun steps, event commands):
TERM every group at once, KILL what is left after a grace. Never used on the job."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any


def kill_groups(procs: Sequence[Any], grace: float = 1.0) -> None:
    """TERM each process's group (srun cancels its step on TERM; a shell's children go too), wait
    up to ``grace`` seconds in all, then KILL the groups (stragglers left in a group, and a leader
    that lingered) and reap. A stand-in that is no Popen (benchmarks) is asked to ``kill()``."""
    real = [p for p in procs if isinstance(p, subprocess.Popen)]
    for proc in real:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in real:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for proc in real:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    for proc in real:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    for proc in procs:
        if not isinstance(proc, subprocess.Popen):
            with contextlib.suppress(Exception):  # a stand-in: whatever its kill() raises, it is done with
                proc.kill()
