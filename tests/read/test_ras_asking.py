"""Asking NCCL RAS safely: one query at a time per address across trainwatch processes, a bounded
gap, the RAS wait inside a one-shot's window, and no query on NCCL versions a query can crash."""

from __future__ import annotations

import ctypes.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ras_server import RasServer, takes
from trainwatch.probes.read.processes import procfacts
from trainwatch.probes.read.collectives import ras
from trainwatch.probes.read.collectives.collective_feed import CollectiveFeed
from trainwatch.probes.read.processes.process import JobProcesses, RankProcess
from trainwatch.probes.read.collectives.sources import FeedOptions, nccl_ras

# One trainwatch process's RAS source, fetching once for a job whose ranks name the stand-in.
FETCH_ONCE = textwrap.dedent("""
    import sys, time
    from trainwatch.probes.read.processes.process import JobProcesses, RankProcess
    from trainwatch.probes.read.collectives.sources import FeedOptions, nccl_ras
    env = {"NCCL_RAS_ADDR": "127.0.0.1:" + sys.argv[1]}
    job = JobProcesses(launcher="torchrun", root_pid=1, host="h", ranks=(RankProcess(pid=4101, rank=0, env=env),))
    source = nccl_ras.Source(FeedOptions())
    print("ready", flush=True)
    sys.stdin.readline()  # both processes start their query together
    source.fetch(job)
    reading = source.reading(job)
    print("asked" if reading.value else "skipped", "|".join(reading.notes), flush=True)
""")


def job(port: int) -> JobProcesses:
    env = {"NCCL_RAS_ADDR": f"127.0.0.1:{port}"}
    return JobProcesses(launcher="torchrun", root_pid=1, host="h", world_size=8,
                        ranks=(RankProcess(pid=4101, rank=0, env=env),))


def test_two_trainwatch_processes_never_ask_at_once():
    with RasServer(takes("healthy"), threaded=True, delay=2.0) as server:
        procs = [subprocess.Popen([sys.executable, "-c", FETCH_ONCE, str(server.port)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True) for _ in range(2)]
        try:
            for proc in procs:
                assert proc.stdout.readline().strip() == "ready"
            for proc in procs:
                proc.stdin.write("go\n")
                proc.stdin.flush()
            outputs = [proc.communicate(timeout=30)[0] for proc in procs]
        finally:
            for proc in procs:
                proc.kill()
    assert server.max_active == 1 and server.queries == 1, (server.max_active, outputs)
    assert sorted(o.split()[0] for o in outputs) == ["asked", "skipped"], outputs
    skipped = next(o for o in outputs if o.startswith("skipped"))
    assert "another trainwatch process is asking NCCL RAS" in skipped


def test_a_second_query_soon_after_is_not_sent(tmp_path):
    with RasServer(takes("healthy")) as server:
        first = ras.QueryLock("127.0.0.1", server.port, directory=str(tmp_path))
        assert first.acquire() is None
        first.release()
        again = ras.QueryLock("127.0.0.1", server.port, directory=str(tmp_path))
        why = again.acquire()
        # "asked 0.0 s ago" on a quiet machine; a busy one may take longer between the two lines
        assert why and re.search(r"asked [01]\.\d s ago: not asked again so soon", why), why
        time.sleep(ras.MIN_GAP_S + 0.1)  # the gap is measured on the wall clock, the sleep on another: a margin
        assert again.acquire() is None
        again.release()


def test_unreachable_ranks_get_a_second_reply_at_once_so_a_one_shot_can_name_them():
    """The first reply shows rank 5 unreachable; the source asks again right away, and the one-shot
    wait covers both replies (each takes as long as RAS's own timeout would)."""
    with RasServer(takes("dead"), delay=0.5) as server:
        feed = CollectiveFeed(job(server.port), sources=[nccl_ras.Source])
        try:
            started = time.monotonic()
            feed.wait(0.1)  # a short window: the RAS wait is part of it
            took = time.monotonic() - started
            got = feed.evidence()
        finally:
            feed.close()
    replies = got.fields["ras"]
    assert server.queries == 2 and len(replies) == 2 and took >= 1.0
    assert [r.status for r in replies[0].report.comms[0].ranks if r.rank == 5] == ["unreachable"]
    assert [r.status for r in replies[1].report.comms[0].ranks if r.rank == 5] == ["dead"]


def test_a_pending_answer_is_said_not_dropped():
    with RasServer(takes("healthy"), stop_after_head=True, json_supported=False) as server:
        feed = CollectiveFeed(job(server.port), sources=[nccl_ras.Source])
        try:
            time.sleep(1.5)
            notes = feed.evidence().notes
        finally:
            feed.close()
    assert any("answer pending for" in n and "judged without it so far" in n for n in notes), notes


@pytest.fixture
def fake_libnccl(tmp_path) -> Path:
    """A real shared library copied under an NCCL-versioned name, for a real process to map."""
    found = ctypes.util.find_library("m")
    candidates = [Path(p) for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6",
                                    "/usr/lib/x86_64-linux-gnu/libm.so.6") if Path(p).exists()]
    if not candidates and not found:
        pytest.skip("no shared library to copy")
    target = tmp_path / "libnccl.so.2.27.3"
    shutil.copy(candidates[0] if candidates else found, target)
    return target


def test_the_nccl_version_is_read_from_what_the_rank_has_mapped(fake_libnccl):
    code = f"import ctypes, time; ctypes.CDLL({str(fake_libnccl)!r}); print('loaded', flush=True); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "loaded"
        assert procfacts.loaded_nccl(proc.pid) == (True, "2.27.3")
        assert procfacts.loaded_nccl(os.getpid()) == (False, None)
    finally:
        proc.kill()
        proc.wait()


def test_a_version_a_query_can_crash_is_not_asked_unless_told(monkeypatch, tmp_path):
    """The version is read from the libnccl the rank has mapped (a real process mapping a library
    named as NCCL names its own): 2.28.9 (NVIDIA/nccl #1762) is not asked by default; 2.29.5 is,
    and a server that refuses JSON then is not asked for its text report (#2346)."""
    def rank_mapping(version: str) -> tuple[subprocess.Popen, JobProcesses]:
        lib = tmp_path / f"libnccl.so.{version}"
        shutil.copy("/lib/x86_64-linux-gnu/libm.so.6" if Path("/lib/x86_64-linux-gnu/libm.so.6").exists()
                    else ctypes.util.find_library("m"), lib)
        code = f"import ctypes, time; ctypes.CDLL({str(lib)!r}); print('loaded', flush=True); time.sleep(30)"
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "loaded"
        env = {"NCCL_RAS_ADDR": f"127.0.0.1:{server.port}"}
        return proc, JobProcesses(launcher="torchrun", root_pid=1, host="h", ranks=(RankProcess(proc.pid, 0, env=env),))

    monkeypatch.delenv("TRAINWATCH_RAS", raising=False)
    with RasServer(takes("healthy")) as server:
        old, old_job = rank_mapping("2.28.9")
        new, new_job = rank_mapping("2.29.5")
        try:
            source = nccl_ras.Source(FeedOptions())
            source.fetch(old_job)
            notes = source.reading(old_job).notes
            assert server.queries == 0 and any("runs NCCL 2.28.9" in n and "#1762" in n and "--ras always" in n
                                               for n in notes), notes
            nccl_ras.Source(FeedOptions()).fetch(new_job)
            assert server.queries == 1  # 2.29.5: asked, for JSON only (its text report can crash: #2346)
            assert server.commands[-2:] == ["SET FORMAT json", "VERBOSE STATUS"]
            time.sleep(ras.MIN_GAP_S)
            monkeypatch.setenv("TRAINWATCH_RAS", "always")
            nccl_ras.Source(FeedOptions()).fetch(old_job)
            assert server.queries == 2
            monkeypatch.setenv("TRAINWATCH_RAS", "never")
            time.sleep(ras.MIN_GAP_S)
            nccl_ras.Source(FeedOptions()).fetch(new_job)
            assert server.queries == 2
        finally:
            for proc in (old, new):
                proc.kill()
                proc.wait()


def test_json_only_never_falls_back_to_text():
    with RasServer(takes("healthy"), json_supported=False) as server:
        reply = ras.query("127.0.0.1", server.port, text_fallback=False)
    assert reply.report is None and "refused JSON" in reply.note
    assert "VERBOSE STATUS" not in server.commands and server.queries == 0


def test_the_nccl_version_of_a_wheel_is_read_from_its_dist_info(fake_libnccl, tmp_path):
    # as pip installs it for torch: nvidia/nccl/lib/libnccl.so.2, versioned only by the wheel's
    # dist-info beside it (seen on an H200: "2.28.9.dist" was read from nvidia_nccl_cu13-2.28.9.dist-info)
    site = tmp_path / "site"
    lib = site / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    lib.parent.mkdir(parents=True)
    shutil.copy(fake_libnccl, lib)
    (site / "nvidia_nccl_cu13-2.28.9.dist-info").mkdir()
    code = f"import ctypes, time; ctypes.CDLL({str(lib)!r}); print('loaded', flush=True); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "loaded"
        assert procfacts.loaded_nccl(proc.pid) == (True, "2.28.9")
    finally:
        proc.kill()
        proc.wait()


def test_the_lock_lives_in_an_owner_only_runtime_folder_and_stale_ones_go(tmp_path, monkeypatch):
    """Lock files go to $XDG_RUNTIME_DIR/trainwatch (0700), not /tmp; one nobody used for an hour is
    removed by the next query, unless someone holds it."""
    import fcntl

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    folder = tmp_path / "trainwatch"
    folder.mkdir(mode=0o755)  # made by someone else's umask: tightened
    stale, held, fresh = (folder / f"ras-10.0.0.{n}-28028.lock" for n in (1, 2, 3))
    for path in (stale, held, fresh):
        path.write_text("1.0")
    hour_ago = time.time() - ras.STALE_LOCK_S - 60
    for path in (stale, held):
        os.utime(path, (hour_ago, hour_ago))
    holder = os.open(held, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        lock = ras.QueryLock("127.0.0.1", 28028)
        assert lock.acquire() is None
        lock.release()
    finally:
        os.close(holder)
    assert lock.path == str(folder / "ras-127.0.0.1-28028.lock") and os.path.exists(lock.path)
    assert (folder.stat().st_mode & 0o777) == 0o700
    assert not stale.exists() and held.exists() and fresh.exists()


def test_a_job_without_nccl_is_not_asked_and_nothing_is_said(tmp_path, monkeypatch):
    """A gloo job (no libnccl mapped, no NCCL_RAS_ADDR): no query, no lock file, no note about RAS."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    job = JobProcesses(launcher="torchrun", root_pid=1, host="h", ranks=(RankProcess(pid=os.getpid(), rank=0, env={}),))
    for options in (FeedOptions(), FeedOptions(bundle=True)):
        source = nccl_ras.Source(options)
        source.fetch(job)
        reading = source.reading(job)
        assert not reading.value and not reading.notes and not reading.files, reading
    assert not (tmp_path / "trainwatch").exists() or not list((tmp_path / "trainwatch").iterdir())
