"""Ray Train's worker records read back (real lines from a Ray 2.60 run)."""

from __future__ import annotations

import json
from pathlib import Path

from trainwatch.probes.read.processes.ray_train import read_ranks, read_worker_group

RECORDED = Path(__file__).parents[1] / "fixtures" / "ray"


def test_each_worker_pid_gets_its_world_rank_and_the_world_size():
    found = read_ranks(RECORDED)
    assert sorted(r.rank for r in found.values()) == [0, 1, 2]
    assert {r.world_size for r in found.values()} == {3}
    assert len({r.run_name for r in found.values()}) == 1 and all(r.node_rank == 0 for r in found.values())


def test_a_damaged_or_foreign_line_is_skipped(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "ray-train-sys-worker-x.log").write_text('not json\n{"message": "no rank"}\n')
    assert read_ranks(tmp_path) == {}


TWO_NODES = RECORDED / "two-nodes"


def test_the_controllers_log_places_every_rank_on_its_node():
    run = next(iter(read_ranks(TWO_NODES / "node1").values())).run_name
    group = read_worker_group(TWO_NODES / "node1", run)
    assert [(p.rank, p.ip, p.local_rank, p.node_rank) for p in group] == [
        (0, "10.213.0.2", 0, 0), (1, "10.213.0.2", 1, 0), (2, "10.213.0.1", 0, 1), (3, "10.213.0.1", 1, 1)]
    here = {p.pid for p in group if p.ip == "10.213.0.1"}
    assert here == set(read_ranks(TWO_NODES / "node1")), "the controller's PIDs are the node's own"
    assert read_worker_group(TWO_NODES / "node1", "another run") == ()
    assert read_worker_group(TWO_NODES / "node2", run) == (), "a worker-only node has no controller log"
    on_node2 = read_ranks(TWO_NODES / "node2")
    assert sorted(r.rank for r in on_node2.values()) == [0, 1] and {r.world_size for r in on_node2.values()} == {4}


def test_the_last_group_started_wins(tmp_path):
    """A worker group restarted (a failure, elastic scaling) is logged again: the newest is the run's."""
    (tmp_path / "train").mkdir()
    lines = []
    for size, ip in ((2, "10.0.0.1"), (2, "10.0.0.9")):
        placed = "".join(f"\n- (ip={ip}, pid={100 + r}) world_rank={r}, local_rank={r}, node_rank=0" for r in range(size))
        lines.append(json.dumps({"message": f"Started training worker group of size {size}: {placed}",
                                 "run_name": "r"}))
    (tmp_path / "train" / "ray-train-sys-controller-x.log").write_text("not json\n" + "\n".join(lines) + "\n")
    assert {p.ip for p in read_worker_group(tmp_path, "r")} == {"10.0.0.9"}
