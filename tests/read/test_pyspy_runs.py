"""Many py-spy runs read from one thread: each bounded by its own timeout, big outputs read whole.

py-spy itself is replaced here by a stand-in script (``TRAINWATCH_PYSPY``): one that never answers,
and one that prints a megabyte, neither of which a real py-spy does on demand. The targets are
real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from trainwatch.probes.read.processes import procfs
from trainwatch.probes.read.stacks.sampler import sample_all


@pytest.fixture
def sleepers():
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)]
    yield [p.pid for p in procs]
    for proc in procs:
        proc.kill()
        proc.wait()


def stand_in(tmp_path, monkeypatch, body: str):
    script = tmp_path / "py-spy"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    monkeypatch.setenv("TRAINWATCH_PYSPY", str(script))
    return script


def test_a_py_spy_that_never_answers_is_stopped_at_its_timeout_and_the_rank_is_named(tmp_path, monkeypatch, sleepers):
    marker = f"sleep 29.{time.time_ns() % 10**6:06d}"  # a duration no other process sleeps
    stand_in(tmp_path, monkeypatch, f"exec {marker}\n")
    start = time.monotonic()
    samples = sample_all([(pid, False, None, False, None) for pid in sleepers], timeout=1.0)
    took = time.monotonic() - start
    # one try (without pausing: one that does not answer is not tried again pausing), bounded, all ranks at once
    assert took < 3.0, took
    for pid in sleepers:
        sample = samples[pid]
        assert sample.threads is None and not sample.gone
        assert f"py-spy did not answer within 1s for PID {pid}" in sample.error.message
        assert procfs.state_letter(pid) in ("S", "R")  # never left stopped
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert left == [], f"stand-ins left running: {left}"


def test_a_megabyte_of_output_from_several_at_once_is_read_whole(tmp_path, monkeypatch, sleepers):
    frames = [{"name": f"f{i}", "filename": "/x/train.py", "line": i, "module": None} for i in range(20000)]
    dump = tmp_path / "dump.json"
    for pid in sleepers:  # the stand-in prints the dump named after the PID it was given
        dump.with_name(f"dump-{pid}.json").write_text(json.dumps(
            [{"thread_name": "MainThread", "os_thread_id": pid, "frames": frames, "active": True, "owns_gil": False}]))
    assert dump.with_name(f"dump-{sleepers[0]}.json").stat().st_size > 1 << 20
    stand_in(tmp_path, monkeypatch, f'pid=""; while [ $# -gt 0 ]; do [ "$1" = --pid ] && pid=$2; shift; done\n'
                                    f'cat "{tmp_path}/dump-$pid.json"\n')
    samples = sample_all([(pid, False, None, False, None) for pid in sleepers], timeout=10.0)
    for pid in sleepers:
        sample = samples[pid]
        assert sample.error is None, sample.error
        assert len(sample.threads) == 1 and len(sample.threads[0].frames) == 20000
        assert sample.threads[0].frames[-1].function == "f19999"


def test_started_is_called_once_every_run_is_under_way(tmp_path, monkeypatch, sleepers):
    marker = f"sleep 1.{time.time_ns() % 10**6:06d}"  # a unique stand-in: each sleeps a second or so, then fails
    stand_in(tmp_path, monkeypatch, f"{marker}\nexit 3\n")
    seen: list[list[str]] = []

    def started() -> None:
        # each stand-in is a shell that execs its `sleep` a moment after it starts (on a loaded machine,
        # a few hundred ms): look until all are there, well within their second
        deadline = time.monotonic() + 0.8
        while True:
            found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
            if len(found) >= len(sleepers) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        seen.append(found)

    samples = sample_all([(pid, False, None, False, None) for pid in sleepers], timeout=5.0, started=started)
    assert len(seen) == 1 and len(seen[0]) == len(sleepers), seen  # called once, with all three running
    assert all(samples[pid].error is not None for pid in sleepers)
