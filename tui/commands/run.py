"""`trainwatch run [--out DIR] [--attach] -- COMMAND...`: start a job armed for post-mortems."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from ...probes import OutputError, TrainwatchError, UsageError, check_out_dir, rundir, signal_name, torch_env
from .common import add_window, require_terminal

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "run", help="start a training command armed for crash and hang evidence",
        description="Run COMMAND unchanged with every rank armed: faulthandler traces, Flight "
                    "Recorder, per-rank logs and an on-demand control socket, all in a run directory. "
                    "Exits with COMMAND's status (128+N if it was killed by signal N).",
    )
    parser.add_argument("--out", type=Path, default=None,
                        help="run directory (default ./trainwatch-runs/<date>-<time>-<pid>)")
    parser.add_argument("--attach", action="store_true", help="open the live view on the job it starts")
    add_window(parser, "run", hidden=True)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command to run", "trainwatch run -- torchrun --nproc-per-node 4 train.py")
    if shutil.which(command[0]) is None:
        raise UsageError(f"command not found: {command[0]}", "check the spelling and your PATH")
    if args.attach:
        require_terminal("run --attach", "leave out --attach, and use `trainwatch watch PID` "
                                                    "or `trainwatch snapshot PID` on the job")
    if args.out is not None:
        check_out_dir(args.out, action="make the run directory")
    run_dir = (args.out or rundir.default_run_dir()).resolve()
    _make_run_dir(run_dir)
    base = dict(os.environ)
    torch = torch_env.find_torch(torch_env.job_python(command, base), base)
    env, added = rundir.armed_env(run_dir, base, name_for=torch.name_for)
    return _supervise(command, env, added, run_dir, args.attach, args.window, torch.version)


def _make_run_dir(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "ranks").mkdir(exist_ok=True)
        rundir.flight_dir(run_dir).mkdir(exist_ok=True)
        probe = run_dir / ".writable"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise OutputError(f"cannot write the run directory {run_dir}: {exc.strerror or exc}",
                          "pass a writable --out DIR") from None


def _supervise(command: list[str], env: dict[str, str], added: dict[str, str], run_dir: Path,
               attach: bool, window: float, torch_version: str | None = None) -> int:
    """Start the command in its own process group, forward signals, return its status."""
    tty_fd = _terminal_fd() if not attach else None
    log = open(run_dir / "launcher.log", "ab") if attach else None
    # Handlers first: a signal that comes while the command starts is passed on once it has a pid.
    started: list[int] = []
    held: list[int] = []
    previous = {sig: signal.signal(sig, lambda n, _f: _forward(started[0], n) if started else held.append(n))
                for sig in FORWARDED}
    try:
        child = subprocess.Popen(command, env=env, process_group=0,
                                 stdout=log, stderr=subprocess.STDOUT if log else None)
    except OSError as exc:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise TrainwatchError(f"cannot start {command[0]}: {exc.strerror or exc}") from None
    finally:
        if log:
            log.close()
    started.append(child.pid)
    for signum in held:
        _forward(child.pid, signum)
    rundir.write_run_json(run_dir, command, added, child.pid, torch_version)
    print(f"trainwatch: armed run {run_dir} (pid {child.pid}; on-demand traces: "
          f"kill -{signal_name(rundir.FAULTHANDLER_SIGNAL)} <rank pid>)", file=sys.stderr, flush=True)
    foreground = _give_terminal(tty_fd, child.pid)
    try:
        if attach:
            _attach(child.pid, window)
        status = child.wait()
        try:  # watch reads how the launcher ended from here (it is not the launcher's parent)
            rundir.write_json(rundir.launcher_exit_file(run_dir), {"pid": child.pid, "status": status,
                                                                    "at": time.time()})
        except OSError as exc:
            print(f"trainwatch: could not record the command's exit status: {exc.strerror}", file=sys.stderr)
    finally:
        if foreground:
            _give_terminal(tty_fd, os.getpgrp())
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _wait_for_tees(run_dir)
    return 128 - status if status < 0 else status


def _forward(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass  # the job has ended already


def _terminal_fd() -> int | None:
    """The controlling terminal when we are its foreground job; None in batch jobs."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass  # no terminal: a batch job
    return None


def _give_terminal(fd: int | None, pgid: int) -> bool:
    """Make ``pgid`` the terminal's foreground group, so Ctrl-C reaches the job as without us."""
    if fd is None:
        return False
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgid)
        return True
    except OSError:
        return False
    finally:
        signal.signal(signal.SIGTTOU, old)


def _wait_for_tees(run_dir: Path, timeout: float = 2.0) -> None:
    """Let each rank's output helper finish copying before the shell prompt returns."""
    pids = [rec.get("tee_pid") for rec in map(rundir.read_json, run_dir.glob("ranks/*/hook.json")) if rec]
    deadline = time.monotonic() + timeout
    for pid in filter(None, pids):
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _attach(pid: int, window: float) -> None:
    try:
        from ...probes import open_source
        from ..app import TrainwatchApp
    except ImportError as exc:
        print(f"trainwatch: live view unavailable ({exc}); the job keeps running", file=sys.stderr)
        return
    time.sleep(1.0)  # let the launcher start its ranks before discovery
    try:
        source = open_source(pid, window)
    except TrainwatchError as exc:
        print(f"trainwatch: {exc}", file=sys.stderr)
    else:
        try:
            TrainwatchApp(source, interval=2.0,
                          quit_help="close the live view; the job keeps running (Ctrl-C then stops it)").run()
        finally:
            source.close()
    print(f"trainwatch: live view closed; waiting for the job (pid {pid}); Ctrl-C stops it",
          file=sys.stderr, flush=True)
