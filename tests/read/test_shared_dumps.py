"""One dump of a rank serves every trainwatch process on the node that wants it at once (issue 40)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from trainwatch.probes.read import runtime_files
from trainwatch.probes.read.stacks import shared_dumps
from trainwatch.probes.snapshot import Frame, ThreadStack

STACK = (ThreadStack("MainThread", tid=1, is_main=True, frames=(Frame("train", "/w/train.py", 9),)),)


@pytest.fixture
def rank(monkeypatch):
    """A process to stand for a rank (its PID and start time name the shared file)."""
    monkeypatch.delenv("TRAINWATCH_SHARED_DUMPS", raising=False)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    path = runtime_files.rank_file(shared_dumps.PREFIX, proc.pid)
    yield proc.pid
    proc.kill()
    proc.wait()
    path.unlink(missing_ok=True)


def left_by_another(pid: int, **changes) -> None:
    path = runtime_files.rank_file(shared_dumps.PREFIX, pid)
    data = json.loads(path.read_text())
    data.update(by=1, **changes)  # as another trainwatch process would have written it
    path.write_text(json.dumps(data))


def test_a_fresh_dump_by_another_process_is_taken_not_taken_again(rank):
    shared_dumps.leave(rank, STACK, {0: {"step": 7}}, time.time(), native=False, locals=True)
    assert shared_dumps.fresh(rank, native=False, locals=False) is None  # our own: we have it already
    left_by_another(rank)
    got = shared_dumps.fresh(rank, native=False, locals=True)
    assert got is not None and got.threads == STACK and got.ints == {0: {"step": 7}}
    assert shared_dumps.fresh(rank, native=True, locals=False) is None  # native frames were not read


def test_a_stale_dump_is_not_taken(rank):
    shared_dumps.leave(rank, STACK, None, time.time() - shared_dumps.FRESH_S - 0.5, native=False, locals=False)
    left_by_another(rank)
    assert shared_dumps.fresh(rank, native=False, locals=False) is None


def test_a_plain_dump_serves_no_one_who_wants_the_step(rank):
    shared_dumps.leave(rank, STACK, None, time.time(), native=False, locals=False)
    left_by_another(rank)
    assert shared_dumps.fresh(rank, native=False, locals=True) is None
    assert shared_dumps.fresh(rank, native=False, locals=False).threads == STACK


def test_the_file_is_the_owner_s_alone(rank):
    shared_dumps.leave(rank, STACK, None, time.time(), native=False, locals=False)
    path = runtime_files.rank_file(shared_dumps.PREFIX, rank)
    assert path.stat().st_mode & 0o077 == 0 and path.parent.stat().st_mode & 0o077 == 0
