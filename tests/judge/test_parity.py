"""One judge, every path: the same recorded evidence gives the same verdict, culprits and words
through the live view, a bundle re-judged with its own Flight Recorder traces, `watch`, and the
merged multi-node view (one node, and the ranks split over two nodes; a node read through the agents'
compact wire and through its snapshot JSON)."""

from __future__ import annotations

import dataclasses

import pytest

from recorded import JOB, WINDOW, JudgeMemory, gloo_mismatch, h100_item_hang, judged
from trainwatch.probes.source import OneNodeSource
from trainwatch.probes.evidence.bundle import rejudged
from trainwatch.probes.evidence.watcher import Watcher
from trainwatch.probes.remote.merge import NodeView, merge_nodes
from trainwatch.probes.remote.wire import decode_line, encode_line
from trainwatch.probes.snapshot import CollectiveState, Snapshot

SCENARIOS = {"h100-item-hang": h100_item_hang, "gloo-mismatch": gloo_mismatch}


def live(scenario: str, with_collectives: bool = True) -> Snapshot:
    """The snapshot the live view builds from this evidence (``LocalSource._build``)."""
    memory = JudgeMemory()
    ranks, collectives, now = SCENARIOS[scenario]()
    state = collectives if with_collectives else None
    judgement = judged(memory, ranks, state, now)
    return Snapshot(job=JOB, ranks=judgement.ranks, groups=judgement.groups, verdict=judgement.verdict,
                    collectives=judgement.collectives, taken_at=now, window_s=WINDOW)


def said(snapshot: Snapshot) -> tuple:
    return snapshot.verdict.kind, snapshot.verdict.culprits, snapshot.verdict.summary


class _Polled(OneNodeSource):
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def poll(self, native_for: frozenset[int] = frozenset()) -> Snapshot:
        return self.snapshot


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_path_says_what_the_live_view_says(scenario, tmp_path):
    expected = live(scenario)
    assert expected.verdict.kind in ("hang", "mismatch")

    # a bundle whose snapshot was taken before the Flight Recorder answered, re-judged with the traces
    bundle = rejudged(live(scenario, with_collectives=False), {"collectives": expected.collectives})
    assert said(bundle) == said(expected)
    assert bundle.groups == expected.groups

    # watch: the verdict line it prints
    lines: list[str] = []
    watcher = Watcher(pid=1, out_dir=tmp_path, source=_Polled(expected), emit=lines.append, dump_on=frozenset())
    watcher._poll()
    (line,) = lines
    assert line.split(" ", 1)[1] == f"verdict {expected.verdict.kind}: {expected.verdict.summary}"

    # the merged view of one node
    merged = merge_nodes([NodeView("h", expected, local=True)])
    assert said(merged) == said(expected)
    assert [(r.rank, r.state) for r in merged.ranks] == [(r.rank, r.state) for r in expected.ranks]


def _own_part(state: CollectiveState, rank: int) -> CollectiveState:
    """What one node reads: its own rank's record of its collectives (judged there alone)."""
    return CollectiveState(source=state.source, ranks=tuple(r for r in state.ranks if r.rank == rank))


def test_ranks_split_over_two_nodes_are_judged_as_one_job():
    expected = live("gloo-mismatch")
    nodes = []
    for n, host in enumerate(("a", "b")):  # each node sees its own rank and its own Flight Recorder
        ranks = tuple(dataclasses.replace(r, host=host) for r in expected.ranks if r.rank == n)
        job = dataclasses.replace(expected.job, host=host, world_size=2)
        nodes.append(NodeView(host, dataclasses.replace(expected, job=job, ranks=ranks,
                                                        collectives=_own_part(expected.collectives, n)),
                              local=n == 0))
    merged = merge_nodes(nodes)
    assert said(merged) == said(expected)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_node_read_through_its_agent_and_through_its_snapshot_json_is_judged_alike(scenario):
    expected = live(scenario)
    through_json = Snapshot.from_json(expected.to_json())
    through_wire = decode_line(encode_line(expected, "h")).snapshot
    by_json = merge_nodes([NodeView("h", through_json, local=False)])
    by_wire = merge_nodes([NodeView("h", through_wire, local=False)])
    assert said(by_wire) == said(by_json) == said(expected)
    assert [(r.rank, r.state, r.where, r.log_tail) for r in by_wire.ranks] == \
        [(r.rank, r.state, r.where, r.log_tail) for r in by_json.ranks]
