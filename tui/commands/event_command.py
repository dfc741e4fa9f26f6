"""`watch --json` and `watch --on-event CMD`: each watch event as one JSON line, and a person's
command run on each alert (a problem that persisted, a crash), bounded in time, off the watch loop."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

from typing import TYPE_CHECKING

from ...probes import kill_groups

if TYPE_CHECKING:
    from ...probes import WatchEvent

MAX_RUNNING = 4  # alerts beyond this while the command is still busy are skipped, and said so
KILL_GRACE_S = 2.0


def event_record(event: WatchEvent, pid: int, host: str) -> dict:
    """The JSON object ``watch --json`` prints for one event (one line each)."""
    return {
        "event": event.kind,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(event.at)),
        "unix_time": round(event.at, 3),
        "pid": pid,
        "host": host,
        "verdict": event.verdict,
        "culprits": list(event.culprits),
        "summary": event.summary,
        "bundle": event.bundle,
        "message": event.text or event.summary,  # alerts print no line of their own: their summary says it
    }


def print_json(event: WatchEvent, pid: int, host: str | None = None) -> None:
    line = json.dumps(event_record(event, pid, host or socket.gethostname()))
    with _PRINT_LOCK:
        print(line, flush=True)


def event_env(event: WatchEvent, pid: int, host: str) -> dict[str, str]:
    """What the --on-event command finds in its environment."""
    return {
        "TRAINWATCH_EVENT": event.kind,
        "TRAINWATCH_VERDICT": event.verdict or "",
        "TRAINWATCH_CULPRITS": ",".join(str(r) for r in event.culprits),
        "TRAINWATCH_SUMMARY": event.summary,
        "TRAINWATCH_BUNDLE": event.bundle or "",
        "TRAINWATCH_PID": str(pid),
        "TRAINWATCH_HOST": host,
    }


class EventCommand:
    """Runs ``command`` (through ``/bin/sh -c``) on each alert, in its own session and thread.

    The watch loop never waits on it: ``fire`` starts a thread that waits at most ``timeout``,
    then ends the command's whole process group. Its output goes to stderr, so --json stays clean."""

    def __init__(self, command: str, pid: int, timeout: float, host: str | None = None) -> None:
        self.command, self.pid, self.timeout = command, pid, timeout
        self.host = host or socket.gethostname()
        self._threads: list[threading.Thread] = []

    def fire(self, event: WatchEvent) -> None:
        if not event.alert:
            return
        self._threads = [t for t in self._threads if t.is_alive()]
        if len(self._threads) >= MAX_RUNNING:
            _note(f"--on-event skipped for this {event.kind}: {MAX_RUNNING} earlier runs still going")
            return
        env = {**os.environ, **event_env(event, self.pid, self.host)}
        thread = threading.Thread(target=self._run, args=(env,), name="trainwatch-on-event", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _run(self, env: dict[str, str]) -> None:
        try:
            proc = subprocess.Popen(["/bin/sh", "-c", self.command], env=env, stdin=subprocess.DEVNULL,
                                    stdout=sys.stderr.fileno(), stderr=sys.stderr.fileno(),
                                    start_new_session=True)
        except OSError as exc:
            _note(f"--on-event could not start: {exc.strerror or exc}")
            return
        try:
            status = proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            kill_groups([proc], grace=KILL_GRACE_S)
            _note(f"--on-event command ran past {self.timeout:g} s and was stopped")
            return
        if status != 0:
            _note(f"--on-event command exited with status {status}")

    def close(self) -> None:
        """At the end of watching: let running commands finish (each is bounded by its timeout)."""
        for thread in self._threads:
            thread.join(self.timeout + 2 * KILL_GRACE_S)


_PRINT_LOCK = threading.Lock()


def _note(text: str) -> None:
    with _PRINT_LOCK:
        print(f"trainwatch: {text}", file=sys.stderr, flush=True)
