"""Closing the terminal leaves nothing running (issue 40): SIGHUP stops what trainwatch started, as
`q` or Ctrl-C does, and never the job it only watches; `run` passes SIGHUP on, as a launcher would."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from real_jobs import PlantedJob, default_signals, wait_until

pytestmark = pytest.mark.job
TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]


def under(folder: Path) -> list[psutil.Process]:
    """Processes whose working directory lies in ``folder`` (the demo job runs in its own)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if str(folder) in proc.cwd() and proc.pid != os.getpid():
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_closing_the_demo_s_terminal_stops_the_demo_job(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    socket_name = f"tw-hup-{os.getpid()}"
    tmux = ["tmux", "-L", socket_name, "-f", "/dev/null"]
    command = " ".join(shlex.quote(p) for p in [*TRAINWATCH, "demo", "--ranks", "2", "--deadline", "120"])
    subprocess.run([*tmux, "new-session", "-d", "-s", "tw", "-x", "120", "-y", "40",
                    f"env TERM=xterm-256color TMPDIR={tmp} {command}"], check=True, timeout=20)
    try:
        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p", "-t", "tw"], capture_output=True, text=True,
                                  timeout=20).stdout
        wait_until(lambda: "STRAGGLER" in screen(), 120, "the demo's straggler verdict")
        (folder,) = list(tmp.glob("trainwatch-demo-*"))
        job = under(folder)
        assert len(job) >= 3  # torchrun and its two ranks
        subprocess.run([*tmux, "kill-server"], timeout=20)  # the terminal goes: SIGHUP to what runs in it
        gone, alive = psutil.wait_procs(job, timeout=45)  # a loaded machine: SIGTERM, a grace, then SIGKILL
        assert not alive, [p.pid for p in alive]
        wait_until(lambda: not folder.exists(), 10, "the demo's folder removed")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=20)
        for proc in under(tmp):
            proc.kill()


def test_sighup_ends_watch_and_leaves_the_job_running(tmp_path):
    with PlantedJob(tmp_path / "job", "straggler", nproc=2, deadline=60) as job:
        job.wait_for_ranks()
        watch = subprocess.Popen([*TRAINWATCH, "watch", str(job.pid), "--interval", "1", "--out", str(tmp_path / "w")],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
        try:
            assert watch.stdout.readline().startswith("watching pid")
            time.sleep(3)  # mid-poll, py-spy runs in flight
            watch.send_signal(signal.SIGHUP)
            assert watch.wait(timeout=30) == 128 + signal.SIGHUP
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
        assert job.alive() and len(job.rank_pids()) == 2  # the job it watched is untouched
        spies = [p for p in psutil.process_iter(["name", "ppid"]) if p.info["name"] == "py-spy"
                 and p.info["ppid"] == watch.pid]
        assert not spies


def test_run_passes_sighup_on_to_its_command(tmp_path):
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGHUP, lambda *a: sys.exit(9))\n"
            "print('ready', flush=True)\n"
            "time.sleep(30)\n")
    proc = subprocess.Popen([*TRAINWATCH, "run", "--out", str(tmp_path / "run"), "--", sys.executable, "-c", code],
                            stdout=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_signals)
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=20) == 9
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
