"""A relay: one node of a tree of agents, as STAT and SLURM fan out.

A viewer reaching a thousand nodes over ssh starts a few dozen relays, not a thousand ssh
connections. Each relay runs the agent on its own node and starts it over ssh on its share of the
others, then writes every line its agents write to its stdout labelled with the agent's task
number (``3: {...}``, as ``srun --label`` does), so the viewer reads a relay as it reads one srun
step. What the viewer writes on the relay's stdin (requests) goes to every agent. An agent that
stops is named in a labelled error line of the wire (why, from its ssh's exit status and stderr)
and started again after a back-off. The relay stops, and stops its agents (their stdin closes,
their process groups end), when its own stdin closes, its parent goes away, or on SIGTERM, SIGHUP
or SIGINT.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from ..process_group import kill_groups
from .calls import STDERR_KEEP, Result, classify_failure
from .reach import Remote
from .node_spec import RESTART_MAX_S, RESTART_MIN_S
from .wire import error_line, whole
from ..record import Record

STOP_GRACE_S = 3.0


@dataclass(repr=False)
class Child(Record):
    """One agent the relay runs: on its own node (``remote`` None) or over ssh."""

    task: int
    name: str
    argv: list[str]
    remote: Remote | None
    proc: subprocess.Popen | None = None
    stderr: bytearray = field(default_factory=bytearray)


class Relay:
    """Runs ``children`` and joins their lines on ``out``; requests from ``requests`` go to all."""

    def __init__(self, children: Sequence[Child], out: BinaryIO, timeout: float) -> None:
        self.children = list(children)
        self.out = out
        self.timeout = timeout
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._request = b""

    def run(self, requests: BinaryIO) -> int:
        threads = [threading.Thread(target=self._keep, args=(child,), name=f"tw-relay-{child.task}", daemon=True)
                   for child in self.children]
        for thread in threads:
            thread.start()
        try:
            self._forward(requests)  # until the viewer closes our stdin
        except KeyboardInterrupt:
            pass  # SIGTERM, SIGHUP or SIGINT (run_relay): stop as on EOF
        self.stop.set()
        self._close_children()
        for thread in threads:
            thread.join(STOP_GRACE_S)
        return 0

    def _forward(self, requests: BinaryIO) -> None:
        try:
            for line in requests:
                with self._lock:
                    if not _asked_once(line):  # what to ask an agent that starts again
                        self._request = line
                    running = [c.proc for c in self.children if c.proc is not None]
                for proc in running:
                    _send(proc, line)
        except (OSError, ValueError):
            pass  # stdin unreadable: as good as closed

    def _keep(self, child: Child) -> None:
        """Run one agent; when it stops, say why on its label and start it again after a back-off."""
        restarts = 0
        while not self.stop.is_set():
            result = self._run_once(child)
            if self.stop.is_set():
                return
            reason = classify_failure(child.remote, result, self.timeout) if child.remote else \
                result.start_error or f"failed with exit status {result.returncode}"
            delay = min(RESTART_MAX_S, RESTART_MIN_S * 2 ** restarts)
            restarts += 1
            said = f"agent stopped: {reason} (from relay {self.children[0].name}; again in {delay:.0f}s)"
            self._write(child.task, whole(error_line(child.name, said, result.returncode or 1)).encode())
            self.stop.wait(delay)

    def _run_once(self, child: Child) -> Result:
        child.stderr.clear()
        try:
            proc = subprocess.Popen(child.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True, bufsize=0)
        except OSError as exc:
            return Result(None, start_error=f"cannot run {child.argv[0]}: {exc.strerror or exc}")
        with self._lock:
            child.proc = proc
            request = self._request
        if request:
            _send(proc, request)
        errors = threading.Thread(target=_tail, args=(proc.stderr, child.stderr), daemon=True)
        errors.start()
        for line in proc.stdout:
            if line.strip():
                self._write(child.task, line.rstrip(b"\n"))
        code = proc.wait()
        errors.join(1.0)
        with self._lock:
            child.proc = None
        return Result(code, stderr=child.stderr.decode(errors="replace"))

    def _write(self, task: int, line: bytes) -> None:
        """One line on ``task``'s label (an agent's lines are whole already: see ``wire.whole``)."""
        with self._lock:
            try:
                self.out.write(f"{task}: ".encode() + line + b"\n")
                self.out.flush()
            except (OSError, ValueError):
                self.stop.set()  # the viewer is gone

    def _close_children(self) -> None:
        with self._lock:
            procs = [c.proc for c in self.children if c.proc is not None]
        for proc in procs:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.close()  # an agent stops when its stdin closes
        kill_groups(procs, grace=STOP_GRACE_S)


def _asked_once(line: bytes) -> bool:
    """A request for one moment (a bundle, the first answers), not for an agent started later."""
    try:
        request = json.loads(line)
    except ValueError:
        return False  # not a request: the agent ignores it too
    return isinstance(request, dict) and ("bundle" in request or "answer" in request)


def _send(proc: subprocess.Popen, line: bytes) -> None:
    try:
        proc.stdin.write(line)
    except (OSError, ValueError):
        pass  # the agent is gone: its thread says so and starts it again


def _tail(stream: BinaryIO, keep: bytearray) -> None:
    """The end of an agent's stderr, read as it comes (a full pipe would stall the agent)."""
    with contextlib.suppress(OSError, ValueError):
        for chunk in iter(lambda: stream.read(4096), b""):
            keep += chunk
            del keep[:-STDERR_KEEP]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds the stdin loop: the relay then stops its agents


def run_relay(children: Sequence[Child], timeout: float) -> int:
    """The ``trainwatch relay`` command: relay until stdin closes (or the parent goes away)."""
    from .node_agent import die_with_parent

    die_with_parent()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _interrupt)
    relay = Relay(children, sys.stdout.buffer, timeout)
    code = relay.run(sys.stdin.buffer)
    sys.stdout.flush()
    os._exit(code)  # agents' reader threads may still block in read()
