"""Ranks already gone when first seen (a zombie's environment cannot be read) are numbered from
torchrun's start order, only where the ranks still readable agree with it."""

from trainwatch.probes.read.processes.discover import _numbered_by_start
from trainwatch.probes.read.processes.process import RankProcess


def rank(pid: int, started: float, number: int | None = None, local: int | None = None) -> RankProcess:
    env = {"RANK": str(number), "LOCAL_RANK": str(local)} if number is not None else {}
    return RankProcess(pid=pid, rank=number, local_rank=local, env=env, create_time=started)


def test_two_zombies_beside_one_live_rank_take_the_numbers_their_start_order_gives():
    ranks = [rank(101, 1.0), rank(102, 2.0, number=9, local=1), rank(103, 3.0)]  # node 3 of 8-rank job
    notes: list[str] = []
    numbered = _numbered_by_start(ranks, [ranks[1]], single_node=False, notes=notes)
    assert [(r.pid, r.rank, r.local_rank) for r in numbered] == [(101, 8, 0), (102, 9, 1), (103, 10, 2)]
    assert notes == ["rank numbers of exited processes inferred from their start order"]


def test_no_guess_when_the_readable_ranks_disagree_with_the_start_order():
    ranks = [rank(101, 1.0, number=1, local=1), rank(102, 2.0), rank(103, 3.0)]
    notes: list[str] = []
    assert _numbered_by_start(ranks, [ranks[0]], single_node=True, notes=notes) == ranks and notes == []


def test_no_guess_on_a_node_of_many_when_no_rank_is_readable():
    ranks = [rank(101, 1.0), rank(102, 2.0)]
    assert _numbered_by_start(ranks, [], single_node=False, notes=[]) == ranks
    assert [r.rank for r in _numbered_by_start(ranks, [], single_node=True, notes=[])] == [0, 1]
