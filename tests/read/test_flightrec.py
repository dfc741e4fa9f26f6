"""Flight Recorder traces read into each rank's collectives (read/collectives/flightrec.py) and
judged across ranks (judge/collectives.py), on real gloo (torch 2.13) and NCCL (H100, torch 2.11)
dumps, constructed cases, and the verdicts they lead to."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from trainwatch.probes.read.collectives.flightrec import (
    HOOK_FORMAT, TraceError, describe, has_entries, hook_reply_traces, load_trace, merge_traces, read_rows,
)
from trainwatch.probes.judge.collectives import judge_collectives
from trainwatch.probes.judge.verdict import behind, judge
from trainwatch.probes.remote.merge import NodeView, merge_nodes
from trainwatch.probes.snapshot import Job, Rank, Snapshot

FIXTURES = Path(__file__).parents[1] / "fixtures" / "fr" / "gloo-2.13"


def analyze(traces: dict[int, dict], source: str = "flight-recorder"):
    """What a view shows: the ranks' traces as read, judged across ranks."""
    return judge_collectives(read_rows(traces, source))


def _load(scenario: str, ext: str) -> dict[int, dict]:
    return {rank: load_trace((FIXTURES / scenario / f"rank{rank}.{ext}").read_bytes()) for rank in (0, 1)}


@pytest.mark.parametrize("ext", ["json", "pkl"])
def test_real_healthy_dump_agrees(ext):
    state = analyze(_load("healthy", ext))
    assert state is not None and state.divergence is None and state.culprits == ()
    assert {(r.rank, r.last_enqueued, r.last_completed, r.op) for r in state.ranks} == {
        (0, 6, 6, "barrier"), (1, 6, 6, "barrier")}


@pytest.mark.parametrize("ext", ["json", "pkl"])
def test_real_one_against_one_mismatch_blames_nobody(ext):
    """Two ranks, two different collectives at #5, both completed #4: no reason to blame either."""
    state = analyze(_load("mismatch", ext))
    assert state.culprits == ()
    assert state.divergence == "ranks disagree at #5: rank 0 enqueued all_reduce; rank 1 enqueued all_gather"
    rows = {r.rank: r for r in state.ranks}
    assert rows[0].op == "all_reduce" and rows[1].op == "all_gather"
    assert rows[0].last_completed == 4 and rows[1].last_enqueued == 5  # pg_status strings read as ints
    assert (rows[0].pending_seq, rows[0].pending_op, rows[1].pending_seq, rows[1].pending_op) == (
        5, "all_reduce", 5, "all_gather")
    assert rows[1].pending_since is not None and rows[1].pending_since > 1.7e9
    assert "rank 1 pg 0: last enqueued #5 all_gather" in "\n".join(describe(state))


def _entry(seq, op="all_reduce", sizes=((4, 4),), dtype="Float", pg="0", retired=True, state="scheduled",
           created_ns=None):
    return {"collective_seq_id": seq, "profiling_name": f"nccl:{op}", "input_sizes": [list(s) for s in sizes],
            "input_dtypes": [dtype], "process_group": [pg, "default_pg"], "pg_id": int(pg) if pg.isdigit() else 0,
            "retired": retired, "state": state, "is_p2p": False, "p2p_seq_id": 0, "time_created_ns": created_ns}


def _trace(*entries, status=None):
    trace = {"version": "2.10", "pg_config": {}, "entries": list(entries)}
    if status is not None:
        trace["pg_status"] = status
    return trace


def test_rank_that_never_reached_a_collective():
    traces = {
        0: _trace(_entry(41), _entry(42, retired=False)),
        1: _trace(_entry(41), _entry(42, retired=False)),
        2: _trace(_entry(41, retired=False)),
    }
    state = analyze(traces)
    assert state.culprits == (2,)
    assert state.divergence == "ranks 0-1 enqueued all_reduce #42; rank 2 never reached it (rank 2 at #41)"
    assert {r.rank: r.last_completed for r in state.ranks} == {0: 41, 1: 41, 2: None}


def test_size_and_dtype_mismatch():
    sizes = analyze({0: _trace(_entry(3)), 1: _trace(_entry(3)), 2: _trace(_entry(3, sizes=((8,),)))})
    assert sizes.culprits == (2,) and "all_reduce of [8]" in sizes.divergence
    dtypes = analyze({0: _trace(_entry(3)), 1: _trace(_entry(3)), 2: _trace(_entry(3, dtype="BFloat16"))})
    assert dtypes.culprits == (2,) and "all_reduce (BFloat16)" in dtypes.divergence


def test_ring_buffer_eviction_is_not_a_divergence():
    # rank 1's buffer no longer holds #1, but pg_status says it went past it
    traces = {0: _trace(_entry(1), _entry(2), status={"0": {"last_enqueued_collective": 2}}),
              1: _trace(_entry(2), status={"0": {"last_enqueued_collective": 2}})}
    assert analyze(traces).divergence is None


def test_several_process_groups():
    traces = {0: _trace(_entry(1, pg="0"), _entry(1, pg="1")),
              1: _trace(_entry(1, pg="0"), _entry(1, pg="1")),
              2: _trace(_entry(1, pg="0"), _entry(1, op="broadcast", pg="1"))}
    state = analyze(traces)
    assert "in process group 1" in state.divergence and state.culprits == (2,)
    assert {(r.rank, r.pg) for r in state.ranks} == {(n, pg) for n in range(3) for pg in "01"}


def test_no_collectives_and_bad_input():
    assert analyze({}) is None
    assert analyze({0: _trace()}) is None
    with pytest.raises(TraceError):
        load_trace(b"not a trace")
    with pytest.raises(TraceError):
        load_trace(b'{"no": "entries"}'.replace(b"no", b"entries").replace(b'"entries"}', b'1}'))
    import os
    import pickle
    evil = pickle.dumps(os.getcwd)  # a global: must be refused, never called
    with pytest.raises(TraceError):
        load_trace(evil)
    damaged = {"entries": [{"collective_seq_id": 1, "input_dtypes": 5, "input_sizes": 3, "process_group": [{}]},
                           {"collective_seq_id": "x"}, 7], "pg_status": ["not", "a", "dict"]}
    [row] = analyze({0: damaged}).ranks  # odd values read as unknown, never a traceback
    assert (row.last_enqueued, row.op, row.sizes, row.dtype) == (1, "?", "?", "?")


def test_works_without_torch():
    import subprocess
    import sys
    code = ("import sys; sys.modules['torch'] = None\n"
            "from pathlib import Path\n"
            "from trainwatch.probes.read.collectives.flightrec import load_trace, read_rows\n"
            "from trainwatch.probes.judge.collectives import judge_collectives\n"
            f"d = Path({str(FIXTURES / 'mismatch')!r})\n"
            "state = judge_collectives(read_rows({r: load_trace((d / f'rank{r}.json').read_bytes()) for r in (0, 1)}))\n"
            "print([row.pending_op for row in state.ranks], state.culprits)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "['all_reduce', 'all_gather'] ()", out.stderr


# ---- real NCCL recordings from an H100 (torch 2.11, NCCL 2.28.9)

H100 = Path(__file__).parents[1] / "fixtures" / "fr" / "h100"


@pytest.mark.parametrize("name, pending, completed", [
    ("hook-dump_nccl_trace_json-hung.json", 544, 543),  # the hook's _dump_nccl_trace_json, during the hang
    ("pipe-dump-rank0.pickle", 544, 543),  # written after a write to the debug-info pipe
    ("on-timeout-dump-rank0.pickle", 785, 784),  # written by the watchdog on its timeout
])
def test_h100_recordings_show_the_pending_all_reduce(name, pending, completed):
    trace = load_trace((H100 / name).read_bytes())
    state = analyze({0: trace}, source="hook")
    [row] = state.ranks
    assert (row.pg, row.last_enqueued, row.last_completed) == ("0", pending, completed)
    assert (row.pending_seq, row.pending_op) == (pending, "all_reduce")
    assert state.divergence is None and state.culprits == ()
    # pending_since is wall-clock time: the pending entry's time_created_ns, after every completed one's
    last = trace["entries"][-1]
    assert last["state"] == "scheduled" and row.pending_since == last["time_created_ns"] / 1e9
    done = [e["time_created_ns"] / 1e9 for e in trace["entries"] if e["state"] == "completed"]
    assert max(done) < row.pending_since < max(done) + 5
    assert 1.7e9 < row.pending_since < 2.0e9  # 2023..2033: seconds since the epoch, not a monotonic clock
    line = describe(state, now=row.pending_since + 27)[0]
    assert line.endswith(f"last completed #{completed}, pending #{pending} all_reduce for 27 s"), line


def test_h100_json_status_is_strings_and_is_read_as_numbers():
    trace = load_trace((H100 / "hook-dump_nccl_trace_json-hung.json").read_bytes())
    assert trace["pg_status"]["0"] == {"last_completed_collective": "543", "last_enqueued_collective": "544",
                                       "last_started_collective": "-1"}
    [row] = analyze({0: trace}).ranks
    assert row.last_completed == 543 and isinstance(row.last_completed, int)


def test_h100_empty_generic_dump_yields_no_state():
    """On an NCCL job _dump_fr_trace_json is empty: no entries, no state, no false 'agree'."""
    trace = load_trace((H100 / "hook-dump_fr_trace_json-nccl-job-EMPTY.json").read_bytes())
    assert not has_entries(trace)
    assert analyze({0: trace}) is None
    assert merge_traces([trace]) is None


def _hook_reply(nccl: str | None, generic: str | None, errors=None) -> str:
    return json.dumps({"format": HOOK_FORMAT, "nccl": nccl, "generic": generic, "errors": errors or {}})


def test_hook_reply_with_both_recorders():
    nccl = (H100 / "hook-dump_nccl_trace_json-hung.json").read_text()
    empty = (H100 / "hook-dump_fr_trace_json-nccl-job-EMPTY.json").read_text()
    traces, notes = hook_reply_traces(_hook_reply(nccl, empty))
    assert [name for name, _ in traces] == ["nccl"] and notes == []  # the empty generic one is dropped
    [row] = analyze({0: merge_traces([t for _, t in traces])}).ranks
    assert (row.pending_seq, row.last_completed) == (544, 543)
    # a gloo job on a torch without the NCCL dump: the generic trace, and why there is no NCCL one
    gloo = (FIXTURES / "healthy" / "rank0.json").read_text()
    traces, notes = hook_reply_traces(_hook_reply(None, gloo, {"nccl": "this torch has no _dump_nccl_trace_json"}))
    assert [name for name, _ in traces] == ["generic"] and "no _dump_nccl_trace_json" in notes[0]


def test_hook_reply_from_an_older_hook_is_the_generic_trace():
    gloo = (FIXTURES / "mismatch" / "rank1.json").read_text()
    [(name, trace)] = hook_reply_traces(gloo)[0]
    assert name == "generic" and trace["entries"][-1]["profiling_name"] == "gloo:all_gather"


def test_hook_reply_bad_input_is_a_trace_error():
    for text in ("", "not json", "[1, 2]"):
        with pytest.raises(TraceError):
            hook_reply_traces(text)
    traces, notes = hook_reply_traces(_hook_reply("{broken", None))
    assert traces == [] and "not a Flight Recorder trace" in notes[0]


def test_merge_keeps_each_recorder_s_groups():
    nccl = _trace(_entry(7, pg="0", retired=False), status={"0": {"last_enqueued_collective": "7",
                                                                    "last_completed_collective": "6"}})
    gloo = _trace(_entry(3, op="all_gather", pg="1"), _entry(9, pg="0"), status={
        "1": {"last_enqueued_collective": 3, "last_completed_collective": 3},
        "0": {"last_enqueued_collective": 9}})  # a group NCCL already holds: NCCL's view wins
    merged = merge_traces([nccl, gloo])
    rows = {r.pg: r for r in analyze({0: merged}).ranks}
    assert (rows["0"].last_enqueued, rows["0"].pending_seq) == (7, 7)
    assert (rows["1"].op, rows["1"].last_completed, rows["1"].pending_seq) == ("all_gather", 3, None)


# ---- no coin tosses: a culprit comes from a reason

def test_two_against_one_names_the_one():
    traces = {0: _trace(_entry(5)), 1: _trace(_entry(5)), 2: _trace(_entry(5, op="all_gather"))}
    state = analyze(traces)
    assert state.culprits == (2,)
    assert state.divergence == "rank 2 enqueued all_gather #5 while ranks 0-1 enqueued all_reduce #5"


def test_an_even_split_names_both_sides_and_no_culprit():
    traces = {0: _trace(_entry(5)), 1: _trace(_entry(5)),
              2: _trace(_entry(5, op="barrier")), 3: _trace(_entry(5, op="barrier"))}
    state = analyze(traces)
    assert state.culprits == ()
    assert state.divergence == "ranks disagree at #5: ranks 0-1 enqueued all_reduce; ranks 2-3 enqueued barrier"
    three = analyze({**traces, 4: _trace(_entry(5, op="broadcast")), 5: _trace(_entry(5, op="broadcast"))})
    assert three.culprits == () and "ranks 4-5 enqueued broadcast" in three.divergence


def test_an_even_split_where_one_side_completed_fewer_names_no_culprit():
    """One against one, one record showing a collective fewer completed: no culprit. #4 completed on
    rank 0, so rank 1 joined it: its record was read earlier, or #4 was still in flight there (on a
    real gloo job under CI load this rule named rank 0 of a mismatch whose truth is a tie)."""
    lagging = {"0": {"last_enqueued_collective": 5, "last_completed_collective": 3}}
    ahead = {"0": {"last_enqueued_collective": 5, "last_completed_collective": 4}}
    traces = {0: _trace(_entry(5), status=ahead), 1: _trace(_entry(5, op="barrier"), status=lagging)}
    state = analyze(traces)
    assert state.culprits == ()
    assert state.divergence.startswith("ranks disagree at #5: ") and "lags" not in state.divergence


def test_a_rank_that_never_reached_a_collective_is_the_culprit_even_one_against_one():
    state = analyze({0: _trace(_entry(41), _entry(42, retired=False)), 1: _trace(_entry(41))})
    assert state.culprits == (1,) and "rank 1 never reached it" in state.divergence


# ---- verdicts with collectives

def _rank(n, state="stuck", phase="collective", op="all_reduce", where="train.py:44 sync_gradients"):
    return Rank(rank=n, pid=100 + n, state=state, phase=phase, op=op if phase == "collective" else None,
                where=where)


def test_stack_tie_names_both_places_and_no_culprit():
    ranks = [_rank(0), _rank(1, op="all_gather", where="train.py:70 sync_metrics")]
    verdict = judge(ranks)
    assert (verdict.kind, verdict.culprits) == ("mismatch", ())
    assert verdict.summary == ("ranks disagree: rank 0 is in all_reduce at train.py:44 sync_gradients; "
                               "rank 1 is in all_gather at train.py:70 sync_metrics")
    three = judge([*ranks, _rank(2)])
    assert (three.kind, three.culprits) == ("mismatch", (1,))
    assert three.summary.startswith("rank 1 is in all_gather at train.py:70 sync_metrics while ranks 0,2 wait in")


def test_flight_recorder_disagreement_is_the_verdict():
    state = analyze(_load("mismatch", "json"), source="hook")
    verdict = judge([_rank(0), _rank(1)], None, state)
    assert (verdict.kind, verdict.culprits) == ("mismatch", ())
    assert verdict.summary == f"{state.divergence} (Flight Recorder, hook)"


def test_trailing_ranks_are_a_straggler_only_while_someone_is_stuck():
    state = analyze({0: _trace(_entry(41), _entry(42, retired=False)), 1: _trace(_entry(41)),
                     2: _trace(_entry(41), _entry(42, retired=False))})
    running = [_rank(n, state="running") for n in range(3)]
    assert judge(running, None, state).kind == "healthy"  # ranks a step apart in a running job
    stuck = [_rank(0), _rank(1, state="running", phase="compute", where="train.py:60 compute_step"), _rank(2)]
    verdict = judge(stuck, None, state)
    assert (verdict.kind, verdict.culprits) == ("straggler", (1,))
    assert "compute at train.py:60" in verdict.summary  # the stacks' wording: where the culprit is
    all_waiting = [_rank(0), _rank(1), _rank(2)]  # stacks alone see one place: Flight Recorder knows better
    verdict = judge(all_waiting, None, state)
    assert (verdict.kind, verdict.culprits) == ("straggler", (1,)) and "never reached" in verdict.summary


def test_behind_names_the_pending_collective_and_its_age():
    trace = load_trace((H100 / "pipe-dump-rank0.pickle").read_bytes())
    state = analyze({0: trace}, source="pipe")
    since = state.ranks[0].pending_since
    assert behind(0, state, now=since + 27.4) == "behind all_reduce #544 (pending 27 s)"
    assert behind(0, state, now=since + 600) == "behind all_reduce #544 (pending 10 min)"
    assert behind(1, state, now=since) is None and behind(0, None, now=since) is None
    done = analyze(_load("healthy", "json"))
    assert behind(0, done, now=since) is None  # nothing pending


def test_pending_fields_survive_json_and_the_multi_node_merge():
    state = analyze({0: load_trace((H100 / "hook-dump_nccl_trace_json-hung.json").read_bytes())}, "hook")
    job = Job(launcher="torchrun", pid=1, host="n1", world_size=2)
    node1 = Snapshot(job=job, ranks=(_rank(0),), collectives=state)
    other = analyze({1: _trace(_entry(544, retired=False, created_ns=1795350338_000000000),
                               status={"0": {"last_enqueued_collective": "544",
                                             "last_completed_collective": "543"}})}, "pipe")
    node2 = Snapshot(job=replace(job, host="n2"), ranks=(_rank(1),), collectives=other)
    decoded = [Snapshot.from_json(s.to_json()) for s in (node1, node2)]
    assert decoded[0].collectives == state
    merged = merge_nodes([NodeView("n1", decoded[0], local=True), NodeView("n2", decoded[1])])
    rows = {r.rank: r for r in merged.collectives.ranks}
    assert (rows[0].pending_seq, rows[0].pending_op, rows[0].pending_since) == (
        544, "all_reduce", state.ranks[0].pending_since)
    assert (rows[1].pending_seq, rows[1].pending_since) == (544, 1795350338.0)
    assert merged.collectives.source == "hook+pipe"


def test_one_rule_picks_a_ranks_trace_for_the_live_view_and_bundles():
    from trainwatch.probes.read.collectives.flightrec import FoundTrace, fresher
    old_file = FoundTrace({"entries": [1]}, "flight-recorder-file", at=100.0)
    hook = FoundTrace({"entries": [2]}, "hook", at=200.0)
    newer_file = FoundTrace({"entries": [3]}, "flight-recorder-file", at=300.0)
    assert fresher(None, old_file) is old_file
    assert fresher(old_file, hook) is hook and fresher(hook, old_file) is hook  # the later one, either order
    assert fresher(hook, newer_file) is newer_file  # a dump written after the fetch is newer
    same_time = FoundTrace({"entries": [4]}, "pipe", at=300.0)
    assert fresher(newer_file, same_time) is same_time and fresher(same_time, newer_file) is same_time
