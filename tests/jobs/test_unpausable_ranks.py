"""Ranks py-spy must not pause: a stopped rank (SIGSTOP: `scontrol suspend`, job control) and a rank
held by someone's debugger (`gdb -p`). Both are read without pausing (`py-spy --nonblocking`), say
so, and are left exactly as found."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from real_jobs import PlantedJob, wait_until
from trainwatch.probes.read import procfs
from trainwatch.probes.read.pyspy import error_line
from watching import rank_pid

pytestmark = [pytest.mark.job]
TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    with PlantedJob(tmp_path_factory.mktemp("unpausable"), "straggler", nproc=2, deadline=90) as planted:
        planted.wait_for_ranks()
        yield planted


def snapshot(pid: int) -> dict:
    proc = subprocess.run([*TRAINWATCH, "snapshot", str(pid), "--json", "--window", "0"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def test_a_stopped_rank_is_read_without_pausing_and_left_stopped(job):
    zero = rank_pid(job, 0)
    os.kill(zero, signal.SIGSTOP)
    try:
        wait_until(lambda: procfs.state_letter(zero) == "T", 10, "rank 0 to stop")
        data = snapshot(job.pid)
        assert procfs.state_letter(zero) == "T"  # still stopped: trainwatch never resumes what it did not stop
    finally:
        os.kill(zero, signal.SIGCONT)
    rank0 = next(r for r in data["ranks"] if r["rank"] == 0)
    assert rank0["where"], rank0  # its stack was read
    assert "rank 0: read without pausing (stopped (T))" in data["notes"], data["notes"]


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")
def test_a_rank_held_by_a_debugger_is_read_and_the_debugger_named(job):
    one = rank_pid(job, 1)
    gdb = subprocess.Popen(["gdb", "-p", str(one), "-batch", "-ex", "shell sleep 60"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: procfs.status_fields(one).get("TracerPid", "0").strip() not in ("0", ""), 20,
                   "gdb to attach")
        data = snapshot(job.pid)
    finally:
        os.killpg(gdb.pid, signal.SIGKILL)  # gdb's death detaches it; the rank runs on
        gdb.wait()
    wait_until(lambda: procfs.state_letter(one) not in ("t", "T"), 10, "rank 1 to run again")
    rank1 = next(r for r in data["ranks"] if r["rank"] == 1)
    assert rank1["where"], rank1
    said = [n for n in data["notes"] if n.startswith("rank 1: read without pausing (")]
    assert said and ("held by a tracer (t)" in said[0] or "traced by gdb (PID" in said[0]), data["notes"]


def test_pyspys_error_line_not_its_backtrace():
    message = ("Error: Operation not permitted (os error 1)\nStack backtrace:\n   0: anyhow::error::<impl>\n"
               "   8: std::rt::lang_start\n   9: main\n")
    assert error_line(message) == "Error: Operation not permitted (os error 1)"
    assert error_line("Failed to find python version from target process\n") == (
        "Failed to find python version from target process")
