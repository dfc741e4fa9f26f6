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

from trainwatch.probes.judge.progress import spun
from trainwatch.probes.read.processes import procfs
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
    ours = [subprocess.Popen(["sleep", "30"]) for _ in range(5)]  # a bare machine may have few of its own
    time.sleep(1.5)
    settled = time.time() - 1  # a younger process may still exec (a shell's child): it changes between reads
    try:
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
    finally:
        for sleeper in ours:
            sleeper.kill()
            sleeper.wait()
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


def test_thread_counters_tell_a_spin_from_a_sleep():
    # A thread that spins stays on a CPU or waits for one; one that loops on a short sleep is off
    # both most of the time and wakes at each sleep's end (judge/progress.py's rule rests on this).
    loops = {"spin": "while time.time() < end: pass",
             "sleep": "while time.time() < end: time.sleep(0.01)"}
    procs = {name: subprocess.Popen([sys.executable, "-c", f"import time; end = time.time() + 20\n{body}"])
             for name, body in loops.items()}
    try:
        time.sleep(0.3)
        first = {name: procfs.thread_counters(p.pid) for name, p in procs.items()}
        time.sleep(0.6)
        second = {name: procfs.thread_counters(p.pid) for name, p in procs.items()}
        for name in loops:
            a, b = first[name], second[name]
            assert a.at_ns < b.at_ns and a.run_ns <= b.run_ns and a.queued_ns is not None  # schedstat read here
        assert spun(first["spin"], second["spin"]) is True
        assert spun(first["sleep"], second["sleep"]) is False
        assert second["sleep"].voluntary - first["sleep"].voluntary >= 20
        assert second["spin"].syscall is None  # running
        assert {first["sleep"].syscall, second["sleep"].syscall} <= {"clock_nanosleep", None}  # None: caught awake
        assert "clock_nanosleep" in {first["sleep"].syscall, second["sleep"].syscall}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_a_timed_wait_keeps_its_name_after_a_dump():
    # py-spy's pause interrupts a timed futex wait, which goes on as restart_syscall: /proc shows
    # that number for the rest of the wait (a hung rank's, forever). The kernel's wchan names it.
    from trainwatch.probes.read.processes.kernel_view import kernel_state
    from trainwatch.probes.read.stacks.pyspy import find_pyspy
    from trainwatch.probes.read.processes.syscalls import RESTART_SYSCALL
    waiter = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait(20)"])
    try:
        deadline = time.monotonic() + 10
        while procfs.wchan(waiter.pid) is None or "futex" not in procfs.wchan(waiter.pid):
            assert time.monotonic() < deadline, "the waiter never reached its futex wait"
            time.sleep(0.05)
        assert kernel_state(waiter.pid).syscall == "futex"
        subprocess.run([find_pyspy(), "dump", "--pid", str(waiter.pid)], capture_output=True, timeout=30, check=True)
        deadline = time.monotonic() + 10  # on a loaded machine the waiter runs again a moment after py-spy lets go
        while not (raw := open(f"/proc/{waiter.pid}/syscall").read().split()[0]).isdigit():
            assert time.monotonic() < deadline, f"the waiter never went back to its wait ({raw})"
            time.sleep(0.02)
        assert int(raw) == RESTART_SYSCALL  # what a reading without wchan would show
        assert kernel_state(waiter.pid).syscall == "futex"
        assert procfs.thread_counters(waiter.pid).syscall == "futex"
    finally:
        waiter.kill()
        waiter.wait()


@pytest.mark.parametrize("wchan,named", [("futex_do_wait", "futex"), ("futex_wait_queue_me", "futex"),
                                         ("hrtimer_nanosleep", "nanosleep"), ("do_sys_poll", "poll"),
                                         ("poll_schedule_timeout.constprop.0", "poll"), ("ep_poll", "epoll_wait"),
                                         (None, "restart_syscall"), ("pipe_read", "restart_syscall")])
def test_a_restarted_wait_is_named_by_where_the_kernel_holds_it(wchan, named):
    from trainwatch.probes.read.processes.syscalls import RESTART_SYSCALL, syscall_name
    assert syscall_name(f"{RESTART_SYSCALL} 0x0 0x0", lambda: wchan) == named
