"""`watch --json` and `watch --on-event CMD`: events a log shipper or a pager can use."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from real_jobs import PlantedJob, default_signals
from trainwatch.probes.evidence.watcher import EXIT_CRASH, WatchEvent
from trainwatch.tui.commands.event_command import EventCommand

TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]


def test_on_event_command_is_bounded_and_never_blocks(tmp_path):
    pidfile = tmp_path / "child.pid"
    hook = EventCommand(f"sleep 60 & echo $! > {pidfile}; sleep 60", pid=4242, timeout=1.0, host="node1")
    hook.fire(WatchEvent("verdict", "verdict hang", "hang"))  # not an alert: nothing runs
    started = time.monotonic()
    hook.fire(WatchEvent("problem", "", "hang", (2,), "rank 2 is stuck", "/tmp/b"))
    assert time.monotonic() - started < 0.5  # the watch loop goes on at once
    deadline = time.monotonic() + 10
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline, "the command never ran"
        time.sleep(0.05)
    child = int(pidfile.read_text())
    hook.close()
    assert time.monotonic() - started < 8  # stopped after its 1 s, not its 60 s
    gone = time.monotonic() + 5  # a killed process under load may take a moment to be scheduled and die
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < gone, "the command's background child outlived its timeout"
        time.sleep(0.05)


@pytest.mark.job
def test_watch_json_and_on_event_on_a_crash(tmp_path):
    seen = tmp_path / "event.env"
    hook = f"env | grep ^TRAINWATCH_ | sort > {seen}"
    with PlantedJob(tmp_path / "job", "raise", nproc=2, step_s=2.0, deadline=60) as job:
        job.wait_for_ranks(steps=0)
        result = subprocess.run([*TRAINWATCH, "watch", str(job.pid), "--out", str(tmp_path / "watch"),
                                 "--json", "--interval", "1", "--on-event", hook],
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == EXIT_CRASH, result.stdout + result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]  # every line is one JSON object
    kinds = [e["event"] for e in events]
    assert kinds[0] == "watching" and kinds[-1] == "job_ended", kinds
    alert = next(e for e in events if e["event"] == "crashed")
    assert alert["verdict"] == "crashed" and alert["culprits"] == [1], alert
    assert "rank 1" in alert["summary"] and alert["pid"] == job.pid and alert["host"]
    assert alert["bundle"] and Path(alert["bundle"], "summary.md").exists()
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines())
    assert env["TRAINWATCH_EVENT"] == "crashed" and env["TRAINWATCH_VERDICT"] == "crashed"
    assert env["TRAINWATCH_CULPRITS"] == "1" and env["TRAINWATCH_BUNDLE"] == alert["bundle"]
    assert env["TRAINWATCH_SUMMARY"] == alert["summary"]


@pytest.mark.job
def test_watch_stopped_early_leaves_no_empty_folder(tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    with PlantedJob(tmp_path / "job", "healthy", nproc=2, deadline=60) as job:
        job.wait_for_ranks(steps=0)
        watch = subprocess.Popen([*TRAINWATCH, "watch", str(job.pid), "--interval", "1"], cwd=cwd,
                                 preexec_fn=default_signals,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = watch.stdout.readline()
            assert first.startswith("watching pid"), first
            assert any(cwd.iterdir())  # the folder is there while watching
            watch.send_signal(signal.SIGINT)  # Ctrl-C before anything was written
            out, err = watch.communicate(timeout=60)
        finally:
            watch.kill()
            watch.wait()
    assert watch.returncode == 130, out + err
    assert os.listdir(cwd) == []  # no empty trainwatch-watch-PID/ left behind
