"""When py-spy cannot (or must not) pause a rank: a rank stopped (SIGSTOP: `scontrol suspend`, job
control), held by someone's debugger (`gdb -p`), the whole job stopped, a rank blocked on a hung
FUSE mount, and trainwatch itself in a container without ptrace (a seccomp filter). Each is read
without pausing, left exactly as found, and judged from the kernel's view: the right culprit with
the reason, through `trainwatch snapshot` with default options."""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from real_jobs import PlantedJob, wait_until
from trainwatch.probes.read.processes import procfs
from trainwatch.probes.read.stacks.pyspy import error_line
from watching import rank_pid

pytestmark = [pytest.mark.job]
TRAINWATCH = [sys.executable, "-m", "trainwatch.tui.cli"]
MEMFS = Path(__file__).parents[1] / "infra" / "memfs.py"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A healthy 2-rank job the tests stop, trace and resume (each leaves it running)."""
    with PlantedJob(tmp_path_factory.mktemp("unpausable"), "healthy", nproc=2, deadline=120) as planted:
        planted.wait_for_ranks()
        yield planted


def snapshot(pid: int, *prefix: str) -> dict:
    proc = subprocess.run([*prefix, *TRAINWATCH, "snapshot", str(pid), "--json"], capture_output=True,
                          text=True, timeout=90)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def stopped(pids: list[int]):
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    for pid in pids:
        wait_until(lambda p=pid: procfs.state_letter(p) == "T", 10, f"PID {pid} to stop")


def test_a_stopped_rank_is_the_culprit_read_without_pausing_and_left_stopped(job):
    one = rank_pid(job, 1)
    stopped([one])
    try:
        data = snapshot(job.pid)
        assert procfs.state_letter(one) == "T"  # still stopped: trainwatch never resumes what it did not stop
    finally:
        os.kill(one, signal.SIGCONT)
    verdict = data["verdict"]
    assert verdict["kind"] == "straggler" and verdict["culprits"] == [1], verdict
    assert verdict["summary"].startswith("rank 1 is stopped (T: SIGSTOP or job control; left so) while rank 0 "
                                         "waits in all_reduce"), verdict
    rank1 = next(r for r in data["ranks"] if r["rank"] == 1)
    assert rank1["where"] and rank1["kernel"]["letter"] == "T", rank1
    assert "read without pausing (stopped (T))" in rank1["detail"], rank1  # the rank's own detail says how
    assert "rank 1: read without pausing (stopped (T))" in data["notes"], data["notes"]


def test_the_whole_job_stopped_is_suspended_not_hung(job):
    ranks = [rank_pid(job, 0), rank_pid(job, 1)]
    stopped(ranks)
    try:
        data = snapshot(job.pid)
        assert all(procfs.state_letter(pid) == "T" for pid in ranks)
    finally:
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)
    assert data["verdict"]["kind"] == "unknown" and data["verdict"]["culprits"] == [], data["verdict"]
    assert data["verdict"]["summary"].startswith("every rank is stopped (T): the job is suspended"), data["verdict"]


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")
def test_a_rank_held_by_a_debugger_is_the_culprit_and_the_debugger_named(job):
    one = rank_pid(job, 1)
    gdb = subprocess.Popen(["gdb", "-p", str(one), "-batch", "-ex", "shell sleep 60"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: procfs.status_fields(one).get("TracerPid", "0").strip() not in ("0", ""), 30,
                   "gdb to attach")
        data = snapshot(job.pid)
    finally:
        os.killpg(gdb.pid, signal.SIGKILL)  # gdb's death detaches it; the rank runs on
        gdb.wait()
    wait_until(lambda: procfs.state_letter(one) not in ("t", "T"), 10, "rank 1 to run again")
    verdict = data["verdict"]
    assert verdict["culprits"] == [1] and f"rank 1 is held by gdb (PID {gdb.pid})" in verdict["summary"], verdict
    said = [n for n in data["notes"] if n.startswith("rank 1: read without pausing (")]
    assert said, data["notes"]


# -- a hung filesystem ------------------------------------------------------------------------------
def _fuse_ready() -> str | None:
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        return "needs root and /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "fuse3 is not installed (apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy (libfuse 3 bindings) unavailable: {exc}"
    return None


@pytest.mark.skipif(_fuse_ready() is not None, reason=str(_fuse_ready()))
def test_a_rank_blocked_on_a_hung_fuse_mount_is_the_culprit(tmp_path):
    """Rank 1 saves a checkpoint into a FUSE mount whose daemon was stopped (a hung gcsfuse/s3fs/NFS
    does the same to a job); rank 0 waits in all_reduce. The kernel names the call, the file and its
    filesystem; the rank is read without pausing (a stop would interrupt the FUSE request)."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    daemon = subprocess.Popen([sys.executable, str(MEMFS), str(mount)], start_new_session=True,
                              stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: os.path.ismount(mount), 20, "the FUSE mount")
        with PlantedJob(tmp_path / "job", "checkpoint", nproc=2, deadline=90, step_s=1.0,
                        extra_env={"TW_CKPT_DIR": str(mount)}) as planted:
            planted.wait_for_ranks(steps=0)
            os.kill(daemon.pid, signal.SIGSTOP)  # the filesystem stops answering before step 3's save
            one = rank_pid(planted, 1)
            wait_until(lambda: (procfs.wchan(one) or "").startswith("request_wait_answer"), 30,
                       "rank 1 to wait for the FUSE daemon")
            data = snapshot(planted.pid)
            state_after = procfs.state_letter(one)
            os.kill(daemon.pid, signal.SIGCONT)
    finally:
        os.kill(daemon.pid, signal.SIGCONT)
        subprocess.run(["fusermount3", "-u", "-z", str(mount)], capture_output=True)
        daemon.terminate()
        daemon.wait(10)
    verdict = data["verdict"]
    assert verdict["kind"] == "straggler" and verdict["culprits"] == [1], verdict
    summary = verdict["summary"]  # torch.save stats the folder, then opens the file: either, on the mount
    assert summary.startswith("rank 1 blocked") and f"() on {mount}" in summary and f"(fuse on {mount})" in summary
    assert "while rank 0 waits in all_reduce" in verdict["summary"], verdict
    rank1 = next(r for r in data["ranks"] if r["rank"] == 1)
    assert rank1["kernel"]["wchan"] == "request_wait_answer" and rank1["kernel"]["fs_type"] == "fuse", rank1
    assert any(n.startswith("rank 1: read without pausing (in ") for n in data["notes"]), data["notes"]
    assert state_after == "S"  # never turned into D by a ptrace stop


# -- a container without ptrace ----------------------------------------------------------------------
DENIED = {"x86_64": (101, 310, 311)}  # ptrace, process_vm_readv, process_vm_writev
# Installs a seccomp filter returning EPERM for those calls (what Docker's default profile does
# without SYS_PTRACE), then the command that follows runs under it, and so do its children (py-spy).


SECCOMP = '''
import ctypes, os, struct, sys
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
deny = %r
prog = [(BPF_LD_W_ABS, 0, 0, 0)]
for i, nr in enumerate(deny):
    prog.append((BPF_JEQ_K, len(deny) - i, 0, nr))
prog.append((BPF_RET_K, 0, 0, 0x7fff0000))            # SECCOMP_RET_ALLOW
prog.append((BPF_RET_K, 0, 0, 0x00050000 | 1))        # SECCOMP_RET_ERRNO | EPERM
raw = b"".join(struct.pack("HBBI", *f) for f in prog)
buf = ctypes.create_string_buffer(raw)
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Prog(len(prog), ctypes.addressof(buf))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0                # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, ctypes.get_errno()  # PR_SET_SECCOMP, FILTER
'''


@pytest.mark.skipif(platform.machine() not in DENIED, reason="the seccomp filter is written for x86_64")
def test_without_ptrace_a_straggler_is_judged_the_same(tmp_path):
    with PlantedJob(tmp_path / "job", "straggler", nproc=2, deadline=90) as planted:
        planted.wait_for_ranks()
        wait_until(lambda: planted.log.exists(), 10, "the log")
        plain = snapshot(planted.pid)
        code = (f"os.execv(sys.executable, [sys.executable, '-m', 'trainwatch.tui.cli', 'snapshot', "
                f"'{planted.pid}', '--json'])")
        proc = subprocess.run([sys.executable, "-c", (SECCOMP % (DENIED["x86_64"],)) + code],
                              capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    denied = json.loads(proc.stdout)
    assert plain["verdict"]["kind"] == "straggler" and plain["verdict"]["culprits"] == [1], plain["verdict"]
    assert (denied["verdict"]["kind"], denied["verdict"]["culprits"]) == ("straggler", [1]), denied["verdict"]
    # A look never pauses a rank (a native stack would): nothing here needed ptrace, so no rank
    # says it could not be read, nor that a pausing attach was refused.
    assert not [n for n in denied["notes"] if n.startswith("rank ")], denied["notes"]


def test_pyspys_error_line_not_its_backtrace():
    message = ("Error: Operation not permitted (os error 1)\nStack backtrace:\n   0: anyhow::error::<impl>\n"
               "   8: std::rt::lang_start\n   9: main\n")
    assert error_line(message) == "Error: Operation not permitted (os error 1)"
    assert error_line("Failed to find python version from target process\n") == (
        "Failed to find python version from target process")


async def test_the_live_view_shows_the_stopped_rank_as_the_culprit(job):
    """The live view once: rank 1 stopped while rank 0 waits; the verdict and the detail pane say so."""
    import io

    from rich.console import Console

    from trainwatch.probes.live import LocalSource
    from trainwatch.tui.app import TrainwatchApp

    def screen_text(app: TrainwatchApp) -> str:
        console = Console(width=app.size[0], file=io.StringIO(), record=True, color_system=None, force_terminal=True)
        console.print(app.screen._compositor.render_update(full=True))
        return console.export_text()

    async def until(pilot, condition, timeout: float) -> None:
        for _ in range(int(timeout / 0.1)):
            if condition():
                return
            await pilot.pause(0.1)
        raise AssertionError(f"not on screen in time:\n{screen_text(app)}")

    one = rank_pid(job, 1)
    stopped([one])
    source = LocalSource(job.pid, window=1.0, gpu=False)
    try:
        app = TrainwatchApp(source, interval=1.0)
        async with app.run_test(size=(120, 40)) as pilot:
            # both on one screen: the header can be drawn a frame before the table and the detail pane
            await until(pilot, lambda: all(s in screen_text(app) for s in ("rank 1 is stopped", "kernel: stopped (T)")),
                        timeout=30)
            text = screen_text(app)
        assert procfs.state_letter(one) == "T"
    finally:
        os.kill(one, signal.SIGCONT)
        source.close()
    assert "STRAGGLER" in text and "kernel: stopped (T)" in text, text
