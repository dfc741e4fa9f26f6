"""MultiNodeSource: parallel fan-out, slow nodes never hold the others back, close kills calls."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainwatch.probes.errors import TrainwatchError
from trainwatch.probes.remote.multinode import MultiNodeSource
from trainwatch.probes.snapshot import Job, Rank, Snapshot


@dataclass(frozen=True)
class FileRemote:
    """A 'node' whose probe prints the snapshot stored in ``<dir>/<name>.json`` after ``<name>.delay`` s."""

    name: str
    dir: str

    def argv(self, trainwatch: str, args: list[str]) -> list[str]:
        base = Path(self.dir) / self.name
        script = (f'echo "$@" > {base}.args; d=$(cat {base}.delay 2>/dev/null || echo 0); sleep "$d"; '
                  f'cat {base}.json')
        return ["sh", "-c", script, "sh", *args]

    def shell_argv(self, script: str) -> list[str]:
        return ["sh", "-c", script]


def snap(host: str, ranks: list[tuple[int, str]], world: int) -> Snapshot:
    job = Job(launcher="torchrun", pid=1, host=host, world_size=world, master_addr="10.0.0.1", master_port=1)
    where = {"collective": "train.py:40 sync_gradients", "compute": "train.py:99 compute_step"}
    return Snapshot(job=job, taken_at=time.time(), window_s=1.0, ranks=tuple(
        Rank(rank=n, pid=100 + n, host=host, state="stuck", phase=phase, where=where[phase],
             op="allreduce" if phase == "collective" else None, stuck_for_s=30.0)
        for n, phase in ranks))


class FakeLocal:
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot, self.closed, self.native = snapshot, False, None
        self.job = snapshot.job

    def poll(self, native_for=frozenset()):
        self.native = native_for
        return self.snapshot

    def close(self):
        self.closed = True


def write_node(tmp: Path, name: str, snapshot: Snapshot | None, delay: float = 0.0) -> FileRemote:
    (tmp / f"{name}.json").write_text(snapshot.to_json() if snapshot else "")
    (tmp / f"{name}.delay").write_text(str(delay))
    return FileRemote(name, str(tmp))


def test_nodes_are_asked_in_parallel(tmp_path):
    local = FakeLocal(snap("n0", [(0, "collective")], world=5))
    remotes = [write_node(tmp_path, f"n{i}", snap(f"n{i}", [(i, "compute" if i == 4 else "collective")], 5),
                          delay=1.0) for i in range(1, 5)]
    source = MultiNodeSource(local, remotes, match=["--match", "10.0.0.1:1"], timeout=20,
                             window=0.5)
    try:
        started = time.monotonic()
        merged = source.poll(native_for=frozenset({0}))
        assert time.monotonic() - started < 3.5  # four 1 s nodes, not 4 s in a row
    finally:
        source.close()
    assert [(r.rank, r.host) for r in merged.ranks] == [(0, "n0"), (1, "n1"), (2, "n2"), (3, "n3"), (4, "n4")]
    assert merged.verdict.culprits == (4,)
    assert local.native == frozenset({0}) and local.closed
    assert (tmp_path / "n1.args").read_text().split() == [
        "snapshot", "--json", "--match", "10.0.0.1:1", "--window", "0.5", "--native"]


def test_a_slow_node_reuses_its_last_snapshot_and_does_not_block(tmp_path):
    local = FakeLocal(snap("n0", [(0, "collective")], world=2))
    fast = write_node(tmp_path, "n1", snap("n1", [(1, "compute")], 2))
    source = MultiNodeSource(local, [fast], match=["--match", "a:1"], timeout=20, wait_s=1.0)
    try:
        first = source.poll()
        assert first.rank(1).host == "n1" and not any(h.error for h in first.hosts)
        (tmp_path / "n1.delay").write_text("6")  # the node turns slow
        started = time.monotonic()
        second = source.poll()
        assert time.monotonic() - started < 2.5
        assert second.rank(1).state == "stuck"  # the earlier answer, flagged
        assert any("n1: slow to answer; showing its snapshot from" in n for n in second.notes)
        assert second.verdict.since == first.verdict.since
    finally:
        source.close()


def test_a_slow_node_without_any_answer_is_named(tmp_path):
    local = FakeLocal(snap("n0", [(0, "collective")], world=2))
    slow = write_node(tmp_path, "n1", snap("n1", [(1, "compute")], 2), delay=30)
    source = MultiNodeSource(local, [slow], match=["--match", "a:1"], timeout=30, wait_s=0.5)
    try:
        started = time.monotonic()
        merged = source.poll()
        assert time.monotonic() - started < 2
    finally:
        source.close()  # kills the sleeping call
    (host,) = [h for h in merged.hosts if h.error]
    assert host.name == "n1" and host.error.startswith("slow: no answer after 0.5s")
    assert merged.rank(1).state == "unknown" and merged.verdict.culprits == ()  # unread, not guilty


def test_timeout_and_failures_are_named_per_node(tmp_path):
    local = FakeLocal(snap("n0", [(0, "collective")], world=3))
    hung = write_node(tmp_path, "n1", snap("n1", [(1, "collective")], 3), delay=30)
    broken = write_node(tmp_path, "n2", None)
    source = MultiNodeSource(local, [hung, broken], match=["--match", "a:1"], timeout=1.0)
    try:
        merged = source.poll()
    finally:
        source.close()
    errors = {h.name: h.error for h in merged.hosts if h.error}
    assert errors["n1"] == "timeout: no answer in 1s"
    assert errors["n2"].startswith("answer is not a snapshot")
    assert [r.rank for r in merged.ranks if r.state == "unknown"] == [1, 2]
    assert merged.verdict.summary.endswith("nodes not read: n1, n2")


def test_no_local_source_and_no_answer_is_an_error(tmp_path):
    broken = write_node(tmp_path, "n1", None)
    source = MultiNodeSource(None, [broken], match=["--match", "a:1"], timeout=5)
    try:
        with pytest.raises(TrainwatchError, match="no node of the job could be read"):
            source.poll()
    finally:
        source.close()


def test_attributes_come_from_the_local_source(tmp_path):
    local = FakeLocal(snap("n0", [(0, "collective")], world=1))
    source = MultiNodeSource(local, [], match=["--match", "a:1"])
    assert source.job is local.job
    source.close()


def test_cap_on_parallel_calls(tmp_path):
    remotes = [write_node(tmp_path, f"n{i}", snap(f"n{i}", [(i, "collective")], 40)) for i in range(40)]
    source = MultiNodeSource(None, remotes, match=["--match", "a:1"], parallel=8)
    try:
        assert source._pool._max_workers == 8
        merged = source.poll()
        assert len([r for r in merged.ranks if r.state != "missing"]) == 40
    finally:
        source.close()
