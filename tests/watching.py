"""`trainwatch watch --json --on-event` running beside a job, its events read as they come (tests
and the death stress script share it)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from real_jobs import PlantedJob, default_signals

TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]
RECORDER = Path(__file__).resolve().parent / "bench" / "recorder"


class Watch:
    """`trainwatch watch PID --json --on-event` running beside the job; events read as they come."""

    def __init__(self, pid: int, workdir: Path, env: dict | None = None, extra_args: tuple[str, ...] = (),
                 record: bool = False) -> None:
        """``record``: the watch writes each problem poll's evidence (tests/bench/recorder), for
        :meth:`recorded` to put in a failure's message."""
        self.hook_out = workdir / "on-event.txt"
        self.record_dir = workdir / "recorded" if record else None
        if self.record_dir is not None:
            self.record_dir.mkdir(exist_ok=True)
            env = {**(env or {}), "TW_RECORD": str(self.record_dir),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(RECORDER), os.environ.get("PYTHONPATH")]))}
        hook = f'echo "$TRAINWATCH_EVENT $TRAINWATCH_CULPRITS $TRAINWATCH_SUMMARY" >> {self.hook_out}'
        self.proc = subprocess.Popen([*TRAINWATCH, "watch", str(pid), "--json", "--interval", "1",
                                      "--out", str(workdir / "watch"), "--on-event", hook, *extra_args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})}, preexec_fn=default_signals)
        self.lines: queue.Queue[str] = queue.Queue()
        self.events: list[dict] = []
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stdout], daemon=True).start()
        self.until(lambda e: e["event"] == "watching", 30)

    def until(self, condition, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                event = json.loads(self.lines.get(timeout=0.5))
            except queue.Empty:
                continue
            self.events.append(event)
            if condition(event):
                return event
        raise AssertionError(f"no such event within {timeout}s; events: {self.events}")

    def stop(self) -> None:
        """Stop watching (as Ctrl-C does), the job left running."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def finish(self, timeout: float = 60) -> int:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
                self.proc.wait(10)
        while not self.lines.empty():
            self.events.append(json.loads(self.lines.get()))
        return self.proc.returncode


    def recorded(self, limit: int = 6000, first: bool = False) -> str:
        """What the watch recorded of its problem polls (the end of it, or with ``first`` its start),
        or why there is nothing."""
        if self.record_dir is None:
            return "(not recorded)"
        text = "".join(path.read_text(errors="replace") for path in sorted(self.record_dir.glob("*.txt")))
        return (text[:limit] if first else text[-limit:]) if text else "(no problem poll recorded)"


def rank_pid(job: PlantedJob, rank: int) -> int:
    text = job.wait_for_log(rf"rank {rank}/\d+ pid (\d+)")
    return int(re.search(rf"rank {rank}/\d+ pid (\d+)", text).group(1))
