"""read/processes/proc.py reads what psutil reads, from the same files: checked against psutil on
every process of this machine, and on one that is gone, one that is a zombie, and one started with
an environment of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from trainwatch.probes.read.processes.proc import Proc, ProcessDenied, ProcessGone, all_processes


def same_as_psutil(pid: int) -> None:
    mine, theirs = Proc(pid), psutil.Process(pid)
    assert mine.create_time() == theirs.create_time()  # to the bit: records made either way agree
    assert mine.ppid() == theirs.ppid()
    assert mine.name() == theirs.name()
    assert mine.cmdline() == theirs.cmdline()
    assert mine.uid() == theirs.uids().real
    assert [p.pid for p in mine.parents()] == [p.pid for p in theirs.parents()]
    assert mine.exe() == theirs.exe()


def test_every_process_here_reads_as_psutil_reads_it():
    checked = 0
    settled = time.time() - 5  # a younger process may still exec (a shell's child): it changes between reads
    for proc in all_processes():
        try:
            if proc.create_time() > settled:
                continue
            same_as_psutil(proc.pid)
        except (ProcessGone, psutil.NoSuchProcess, psutil.ZombieProcess, FileNotFoundError):
            continue  # exited meanwhile, or a kernel thread without an executable
        except (ProcessDenied, psutil.AccessDenied):
            continue  # PID 1 of a container, say: both are refused alike
        checked += 1
    assert checked >= 5


def test_children_environment_and_a_zombie():
    env = {**os.environ, "TW_PROC_TEST": "a=b c"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        me = Proc(os.getpid())
        assert child.pid in [p.pid for p in me.children()]
        assert Proc(child.pid).environ()["TW_PROC_TEST"] == "a=b c"
        assert Proc(child.pid).environ() == psutil.Process(child.pid).environ()
        assert Proc(child.pid).state() in ("S", "R")
        child.kill()
        deadline = time.monotonic() + 10
        while Proc(child.pid).state() != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert Proc(child.pid).state() == "Z"  # not reaped yet: still there, as a zombie
        with pytest.raises(ProcessGone):  # its memory is gone (psutil: ZombieProcess)
            Proc(child.pid).environ()
        with pytest.raises(psutil.ZombieProcess):
            psutil.Process(child.pid).environ()
    finally:
        child.kill()
        child.wait()
    with pytest.raises(ProcessGone):
        Proc(child.pid)


def test_one_status_field_reads_as_the_whole_status_does():
    from trainwatch.probes.read.processes import procfs
    whole = procfs.status_fields(os.getpid())
    stable = ("Name", "Umask", "Tgid", "Pid", "PPid", "TracerPid", "Uid", "Gid", "SigCgt", "CapEff", "Seccomp")
    assert {name: procfs.status_field(os.getpid(), name) for name in stable} == {n: whole[n].strip() for n in stable}
    assert procfs.status_field(os.getpid(), "NoSuchField") is None
