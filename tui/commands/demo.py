"""`trainwatch demo`: start a small planted gloo job and watch it (the demo job is ours to stop)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ...probes import TrainwatchError
from .common import WINDOW_DEFAULTS, count_between, positive_seconds, require_terminal
from ..planted import SCENARIOS, stop_job_tree
from .. import hangup

PLANTED = Path(__file__).resolve().parents[1] / "planted.py"  # copied next to the job as train.py


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("demo", help="start a small CPU training job with a planted fault and watch it")
    parser.add_argument("--scenario", choices=SCENARIOS, default="straggler", help="the fault to plant")
    parser.add_argument("--ranks", type=count_between(1, 64), default=4, help="number of ranks (1-64; default: 4)")
    parser.add_argument("--deadline", type=positive_seconds, default=600.0, metavar="S",
                        help="the job exits by itself after this many seconds (default: 600)")
    parser.add_argument("--interval", type=positive_seconds, default=2.0, metavar="S", help="seconds between samples")
    parser.add_argument("--no-tui", action="store_true", help="print one snapshot table instead of the live view")
    parser.set_defaults(func=run)


class DemoJob:
    """The planted job in its own session, so stopping it takes every rank down."""

    def __init__(self, scenario: str, ranks: int, deadline: float, step_s: float = 0.05) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="trainwatch-demo-"))
        shutil.copy(PLANTED, self.dir / "train.py")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                    "--master-port", str(port), "train.py", "--scenario", scenario, "--deadline", str(deadline),
                    "--step-s", str(step_s), "--ddp"]  # DDP, as real jobs: gradients synced inside backward()
        self.ranks = ranks
        self.log = self.dir / "job.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "DemoJob":
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=self.dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def wait_for_ranks(self, timeout: float = 90.0, say=None) -> None:  # noqa: ANN001
        """Wait until every rank printed its ``scenario`` line (it has joined the process group),
        saying each step as it happens through ``say`` (one line a step): the launcher up, the rank
        processes started (each then imports torch: the slow part), the ranks joined."""
        assert self.proc is not None
        say = say or (lambda line: None)
        started = time.monotonic()
        steps = DemoSteps(self.ranks, lambda line: say(f"[{time.monotonic() - started:4.1f}s] {line}"))
        steps.launcher(self.proc.pid)
        while time.monotonic() - started < timeout:
            text = self.log.read_text(errors="replace")
            steps.processes(self._rank_processes())
            joined = text.count(" scenario ")
            steps.joined(joined)
            if joined >= self.ranks:
                time.sleep(1.0)  # a few steps, so the first sample sees the job at work
                return
            if self.proc.poll() is not None:
                raise TrainwatchError(f"the demo job exited early (status {self.proc.returncode})",
                                      remedy=f"see its log: {self.log}")
            time.sleep(0.2)
        raise TrainwatchError(f"the demo job's ranks did not start within {timeout:.0f}s",
                              remedy=f"see its log: {self.log}")

    def _rank_processes(self) -> int:
        """How many rank processes the launcher has started so far."""
        import psutil

        try:
            return len(psutil.Process(self.proc.pid).children())
        except psutil.Error:
            return 0

    def stop(self) -> None:
        if self.proc is None:
            return
        stop_job_tree(self.proc.pid)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            print(f"trainwatch demo: the demo job (PID {self.proc.pid}) did not end within 10 s after SIGKILL",
                  file=sys.stderr)
        shutil.rmtree(self.dir, ignore_errors=True)


class DemoSteps:
    """The demo job's start, a line per step as it happens (the ranks' start takes a while)."""

    def __init__(self, ranks: int, say) -> None:  # noqa: ANN001
        self.ranks, self.say = ranks, say
        self._started = self._joined = 0

    def launcher(self, pid: int) -> None:
        self.say(f"torchrun started (PID {pid}); it starts {self.ranks} rank processes")

    def processes(self, count: int) -> None:
        if count > self._started:
            self._started = count
            if count >= self.ranks:
                self.say(f"{count} rank processes running; each imports torch, then joins the gloo "
                         "process group (the slow part)")

    def joined(self, count: int) -> None:
        if count > self._joined:
            self._joined = min(count, self.ranks)
            done = "; training a few steps before the first sample" if count >= self.ranks else ""
            self.say(f"ranks in the process group: {self._joined}/{self.ranks}{done}")


def require_torch() -> None:
    if importlib.util.find_spec("torch") is None:
        raise TrainwatchError("demo needs PyTorch in this environment: pip install torch")


def run(args: argparse.Namespace) -> int:
    if not args.no_tui:
        require_terminal("demo", "use `trainwatch demo --no-tui` for one snapshot table")
    require_torch()
    job = DemoJob(args.scenario, args.ranks, args.deadline).start()
    hangup.at_hangup(job.stop)
    try:
        print(f"trainwatch: starting a {args.ranks}-rank '{args.scenario}' demo job (torchrun, gloo on this CPU) "
              f"in {job.dir}", file=sys.stderr)
        job.wait_for_ranks(say=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
        print(f"  attaching: the first sample watches the job for {WINDOW_DEFAULTS['attach']:g} s", file=sys.stderr)
        from ...probes import open_source
        source = open_source(job.proc.pid, window=WINDOW_DEFAULTS["attach"])
        try:
            if args.no_tui:
                show_once(source)
            else:
                demo_app(source, args).run()
        finally:
            source.close()
    finally:
        job.stop()
    return 0


def demo_app(source, args: argparse.Namespace):
    """The live view, but ``q`` also stops the demo job (trainwatch demo started it; nobody else did)."""
    from textual.binding import Binding

    from ..app import TrainwatchApp

    class DemoApp(TrainwatchApp):
        BINDINGS = [Binding("q", "quit", "quit+stop demo")]

    return DemoApp(source, interval=args.interval, title=f"trainwatch demo: {args.scenario}",
                   quit_help="quit and stop the demo job (trainwatch demo started it; attach never stops a job)")


def show_once(source) -> None:
    from rich.console import Console
    snapshot = source.poll()
    try:
        from ..render import render_table
    except ImportError:
        print(snapshot.to_json())
        return
    Console().print(render_table(snapshot))
