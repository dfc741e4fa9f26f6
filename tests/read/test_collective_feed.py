"""The collective-state feed against real FIFOs, sockets and dump files: it never holds a poll."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trainwatch.probes import rundir
from trainwatch.probes.judge.progress import CompletedCollectives
from trainwatch.probes.read.collectives.collective_feed import CollectiveFeed, collect
from trainwatch.probes.read.processes.process import JobProcesses, RankProcess
from trainwatch.probes.read.collectives.sources import FeedOptions

H100_PIPE_DUMP = Path(__file__).parents[1] / "fixtures" / "fr" / "h100" / "pipe-dump-rank0.pickle"


@pytest.fixture
def fake_rank(tmp_path):
    """Factory: a sleeping process with the given environment, playing rank 0 of a job."""
    procs: list[subprocess.Popen] = []

    def start(env: dict[str, str], run_dir: Path | None = None) -> JobProcesses:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env})
        procs.append(proc)
        rank = RankProcess(pid=proc.pid, rank=0, local_rank=0, env=dict(env))
        return JobProcesses(launcher="torchrun", root_pid=proc.pid, host="h", ranks=(rank,),
                            run_dir=str(run_dir) if run_dir else None, started_at=time.time() - 5)

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


class _Watchdog:
    """Plays the rank's NCCL watchdog: reads the FIFO, and answers each request ``delay`` s later
    by writing the H100 pipe dump where torch would."""

    def __init__(self, fifo: Path, dump: Path, delay: float) -> None:
        self.fifo, self.dump, self.delay = fifo, dump, delay
        self.requests: list[float] = []
        self.stop = threading.Event()
        self.fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader exists: writes succeed
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                data = os.read(self.fd, 100)
            except BlockingIOError:
                data = b""
            if data:
                self.requests.append(time.monotonic())
                if self.stop.wait(self.delay):
                    return
                self.dump.write_bytes(H100_PIPE_DUMP.read_bytes())
            time.sleep(0.02)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        os.close(self.fd)


def test_pipe_wait_never_holds_a_poll(tmp_path, fake_rank):
    """Nobody answers the FIFO for 2 s, then the file appears: ``latest()`` returns at once
    throughout, the state arrives later, and the pipe is asked once per stuck episode."""
    env = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "pipe_"),
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "nccl_trace_rank_")}
    os.mkfifo(tmp_path / "pipe_0.pipe")
    watchdog = _Watchdog(tmp_path / "pipe_0.pipe", tmp_path / "nccl_trace_rank_0", delay=2.0)
    feed = CollectiveFeed(fake_rank(env), min_interval=0.0)
    try:
        assert feed.wait(5) is None  # not stuck yet: the pipe is left alone, and nothing is on disk
        assert watchdog.requests == []
        state, empty_answers, slowest = None, 0, 0.0
        deadline = time.monotonic() + 20
        while state is None and time.monotonic() < deadline:
            started = time.monotonic()
            state = feed.latest(stuck=True)
            slowest = max(slowest, time.monotonic() - started)
            empty_answers += state is None and bool(watchdog.requests)
            time.sleep(0.05)
        assert state is not None, "the pipe's dump never reached the feed"
        assert slowest < 0.5, slowest  # the 2 s wait happened elsewhere
        assert empty_answers >= 5  # polls went on, answered at once, while the dump was awaited
        assert len(watchdog.requests) == 1  # asked once in this episode, however often polled
        [row] = state.ranks
        assert state.source == "pipe" and (row.pending_seq, row.pending_op, row.last_completed) == (
            544, "all_reduce", 543)
        # The episode ends (no rank stuck); a new one may ask again, once.
        feed.latest(stuck=False)
        deadline = time.monotonic() + 10
        while len(watchdog.requests) < 2 and time.monotonic() < deadline:
            feed.latest(stuck=True)
            time.sleep(0.1)
        time.sleep(0.5)
        assert len(watchdog.requests) == 2
    finally:
        feed.close()
        watchdog.close()


def _dump(path: Path, completed: int) -> None:
    """A gloo-style trace whose last completed collective is ``completed``."""
    entries = [{"collective_seq_id": s, "profiling_name": "gloo:all_reduce", "input_sizes": [[4]],
                "input_dtypes": ["Float"], "process_group": ["0", "default_pg"], "retired": s <= completed,
                "state": "scheduled", "is_p2p": False, "time_created_ns": time.time_ns()}
               for s in range(1, completed + 2)]
    status = {"0": {"last_enqueued_collective": str(completed + 1), "last_completed_collective": str(completed)}}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"version": "2.10", "pg_status": status, "entries": entries}))
    os.replace(tmp, path)


def test_progress_is_completed_sequence_numbers_advancing(tmp_path, fake_rank):
    env = {"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_rank_")}
    dump = tmp_path / "fr_rank_0"
    _dump(dump, 5)
    feed = CollectiveFeed(fake_rank(env), min_interval=0.0)
    try:
        state = feed.wait(5)
        assert state.source == "flight-recorder-file" and state.ranks[0].pending_seq == 6
        seen = CompletedCollectives()  # what the live source keeps between polls
        assert seen.advanced(state) == set()  # one fetch: nothing to compare yet
        for completed, moved in ((7, {0}), (7, set())):
            time.sleep(0.05)  # a newer mtime: a new dump, not the same one read again
            _dump(dump, completed)
            feed.refresh()
            assert seen.advanced(feed.wait(5)) == moved, completed
    finally:
        feed.close()


def test_a_hook_that_never_answers_is_bounded(tmp_path, fake_rank):
    """An armed rank whose hook accepts and then says nothing (a stopped process)."""
    run_dir = tmp_path / "run"
    rundir.rank_dir(run_dir, 0).mkdir(parents=True)
    sock_path = tmp_path / "h.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    server.listen(4)
    rundir.write_json(rundir.hook_json(run_dir, 0), {"rank": 0, "socket": str(sock_path)})
    try:
        job = fake_rank({}, run_dir)
        started = time.monotonic()
        feed = CollectiveFeed(job, options=FeedOptions(hook_timeout=5.0))
        assert feed.latest() is None
        assert time.monotonic() - started < 0.5  # the silent hook is waited for in the background
        feed.close()
        started = time.monotonic()
        assert collect(job, timeout=1.0) is None
        assert 0.9 < time.monotonic() - started < 3.0  # the one-shot helper keeps its deadline
    finally:
        server.close()


def test_a_source_that_fails_is_a_note_not_silence_and_the_others_still_read():
    """A probe bug in one source must not take the feed down, nor vanish: the evidence says what was lost."""
    from trainwatch.probes.read.collectives.sources import CollectiveSource, Reading

    class Broken(CollectiveSource):
        field = "broken"

        def fetch(self, job: JobProcesses) -> None:
            raise ValueError("damaged record at offset 12")

    class Fine(CollectiveSource):
        field = "fine"

        def reading(self, job: JobProcesses) -> Reading:
            return Reading(notes=("fine read it",))

    job = JobProcesses(launcher="torchrun", root_pid=1, host="h")
    feed = CollectiveFeed(job, sources=[Broken, Fine])
    try:
        feed.wait(5)
        notes = feed.evidence().notes
    finally:
        feed.close()
    assert "fine read it" in notes
    assert "collective state from broken lost: ValueError: damaged record at offset 12" in notes, notes
