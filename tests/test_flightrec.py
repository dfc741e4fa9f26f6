"""Cross-rank Flight Recorder analysis on real gloo dumps (torch 2.13) and constructed cases."""

from pathlib import Path

import pytest

from trainwatch.probes.flightrec import TraceError, analyze, describe, load_trace

FIXTURES = Path(__file__).parent / "fixtures" / "fr" / "gloo-2.13"


def _load(scenario: str, ext: str) -> dict[int, dict]:
    return {rank: load_trace((FIXTURES / scenario / f"rank{rank}.{ext}").read_bytes()) for rank in (0, 1)}


@pytest.mark.parametrize("ext", ["json", "pkl"])
def test_real_healthy_dump_agrees(ext):
    state = analyze(_load("healthy", ext))
    assert state is not None and state.divergence is None and state.culprits == ()
    assert {(r.rank, r.last_enqueued, r.last_completed, r.op) for r in state.ranks} == {
        (0, 6, 6, "barrier"), (1, 6, 6, "barrier")}


@pytest.mark.parametrize("ext", ["json", "pkl"])
def test_real_mismatch_dump_names_the_culprit(ext):
    state = analyze(_load("mismatch", ext))
    assert state.culprits == (1,)
    assert state.divergence == "rank 1 enqueued all_gather #5 while rank 0 enqueued all_reduce #5"
    rows = {r.rank: r for r in state.ranks}
    assert rows[0].op == "all_reduce" and rows[1].op == "all_gather"
    assert rows[0].last_completed == 4 and rows[1].last_enqueued == 5
    assert "rank 1 pg 0: last enqueued #5 all_gather" in "\n".join(describe(state))


def _entry(seq, op="all_reduce", sizes=((4, 4),), dtype="Float", pg="0", retired=True, state="scheduled"):
    return {"collective_seq_id": seq, "profiling_name": f"nccl:{op}", "input_sizes": [list(s) for s in sizes],
            "input_dtypes": [dtype], "process_group": [pg, "default_pg"], "pg_id": int(pg) if pg.isdigit() else 0,
            "retired": retired, "state": state, "is_p2p": False, "p2p_seq_id": 0}


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
    dtypes = analyze({0: _trace(_entry(3)), 1: _trace(_entry(3, dtype="BFloat16"))})
    assert dtypes.culprits == (1,) and "all_reduce (BFloat16)" in dtypes.divergence


def test_ring_buffer_eviction_is_not_a_divergence():
    # rank 1's buffer no longer holds #1, but pg_status says it went past it
    traces = {0: _trace(_entry(1), _entry(2), status={"0": {"last_enqueued_collective": 2}}),
              1: _trace(_entry(2), status={"0": {"last_enqueued_collective": 2}})}
    assert analyze(traces).divergence is None


def test_several_process_groups():
    traces = {0: _trace(_entry(1, pg="0"), _entry(1, pg="1")),
              1: _trace(_entry(1, pg="0"), _entry(1, op="broadcast", pg="1"))}
    state = analyze(traces)
    assert "in process group 1" in state.divergence and state.culprits == (1,)
    assert {(r.rank, r.pg) for r in state.ranks} == {(0, "0"), (0, "1"), (1, "0"), (1, "1")}


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


def test_works_without_torch():
    import subprocess
    import sys
    code = ("import sys; sys.modules['torch'] = None\n"
            "from pathlib import Path\n"
            "from trainwatch.probes.flightrec import analyze, load_trace\n"
            f"d = Path({str(FIXTURES / 'mismatch')!r})\n"
            "print(analyze({r: load_trace((d / f'rank{r}.json').read_bytes()) for r in (0, 1)}).culprits)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "(1,)", out.stderr
