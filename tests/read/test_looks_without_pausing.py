"""A look reads a rank without stopping it; only a native stack pauses it; a torn read is read again.

A pausing attach stops every thread of the process, and each blocked thread wakes from its wait
twice (the stop and the resume): its voluntary context switches grow. A thread that sleeps on an
Event and never wakes on its own shows whether a read paused the process. The targets are real
processes; the torn reads are stand-ins (``TRAINWATCH_PYSPY``), since a real tear cannot be had on
demand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import pytest

from real_jobs import wait_until
from trainwatch.probes.observed import ThreadCounters
from trainwatch.probes.read.processes import procfs
from trainwatch.probes.read.stacks.sampler import sample_all, whole
from trainwatch.probes.snapshot import Frame, ThreadStack

# Idle threads, then a main thread that computes forever: the idle ones only wake when paused.
TARGET = """
import threading, time
for _ in range(40):
    threading.Thread(target=threading.Event().wait, daemon=True).start()
print("ready", flush=True)
def work():
    n = 0
    while True:
        n += sum(range(50))
work()
"""


@pytest.fixture
def target():
    proc = subprocess.Popen([sys.executable, "-c", TARGET], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc.pid
    proc.kill()
    proc.wait()


def thread_ids(pid: int) -> list[int]:
    return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]


def idle_wakeups(pid: int) -> int:
    """Voluntary switches of the process's idle threads, together (each only wakes when paused)."""
    return sum(procfs.thread_counters(pid, tid).voluntary for tid in thread_ids(pid) if tid != pid)


def test_a_look_does_not_pause_the_rank_and_a_native_stack_does(target):
    wait_until(lambda: len(thread_ids(target)) >= 41, 10, "the idle threads")
    before = idle_wakeups(target)
    looks = [sample_all([(target, False, None, False, None)])[target] for _ in range(3)]
    after_looks = idle_wakeups(target)
    for look in looks:
        assert look.error is None and look.read is None, (look.error, look.read)
        main = next(t for t in look.threads if t.is_main)
        assert [f.function for f in main.frames if not f.native][:2] == ["work", "<module>"], main.frames
    assert after_looks == before, f"three looks woke the idle threads {after_looks - before} times"
    native = sample_all([(target, True, None, False, None)])[target]
    assert native.error is None
    assert idle_wakeups(target) >= after_looks + 40, "a native stack needs the pause: each idle thread woke"


def test_whole_reads():
    def stack(*functions: str) -> list[ThreadStack]:
        return [ThreadStack("MainThread", 1, tuple(Frame(f, "/x/train.py", 3) for f in functions), is_main=True)]

    still, moved = ThreadCounters(5, 7, 1), ThreadCounters(9, 7, 1)
    assert whole(stack("step", "<module>"), still, moved)
    assert whole(stack("step", "_run_code", "_run_module_as_main"), still, moved)  # python -m
    assert not whole(stack("step", "train"), still, moved)  # lost its outer frames while read
    assert whole(stack("step", "train"), still, still)  # it did not run: nothing could move
    assert whole([ThreadStack("MainThread", 1, (Frame("cudaStreamSynchronize", "libcudart.so", native=True),),
                              is_main=True)], still, moved)
    training = [ThreadStack("MainThread", 1, (Frame("join", "/x/threading.py", 1), Frame("<module>", "/x/w.py", 1)),
                            is_main=True),
                ThreadStack("TrainingThread", 7, (Frame("step", "/x/train.py", 3), Frame("run", "/x/threading.py", 2)))]
    assert not whole(training, still, moved, tid=7)  # the thread judged (Ray Train's) lost its start
    assert whole([training[0], ThreadStack("TrainingThread", 7, (*training[1].frames, Frame("_bootstrap", "/x/t.py", 9)))],
                 still, moved, tid=7)


def test_a_torn_read_is_read_again_then_with_the_pause(target, tmp_path, monkeypatch):
    """py-spy's stand-in answers a torn stack to every read without pausing and a whole one to the
    pausing read: the sample is the pausing one, reached after one more try without."""
    calls = tmp_path / "calls"
    torn = [{"thread_name": "MainThread", "os_thread_id": target, "active": True, "owns_gil": True,
             "frames": [{"name": "work", "filename": "/x/t.py", "line": 8, "module": None}]}]
    fine = [{**torn[0], "frames": [*torn[0]["frames"], {"name": "<module>", "filename": "/x/t.py", "line": 9,
                                                         "module": None}]}]
    (tmp_path / "torn.json").write_text(json.dumps(torn))
    (tmp_path / "fine.json").write_text(json.dumps(fine))
    script = tmp_path / "py-spy"
    # Each read without pausing lasts 0.3 s, so the busy target surely runs during it: a read it did
    # not run through is whole by the product's rule (seen on a loaded machine: one read, no retry).
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncase "$*" in *--nonblocking*) sleep 0.3; '
                      f'cat {tmp_path}/torn.json;; *) cat {tmp_path}/fine.json;; esac\n')
    script.chmod(0o755)
    monkeypatch.setenv("TRAINWATCH_PYSPY", str(script))
    sample = sample_all([(target, False, None, False, procfs.thread_counters(target))])[target]
    made = calls.read_text().splitlines()
    assert ["--nonblocking" in call for call in made] == [True, True, False], made
    assert [f.function for f in sample.threads[0].frames] == ["work", "<module>"]
