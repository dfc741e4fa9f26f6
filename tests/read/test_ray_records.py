"""Ray Train's worker records read back (real lines from a Ray 2.60 run)."""

from __future__ import annotations

from pathlib import Path

from trainwatch.probes.read.ray_train import read_ranks

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
