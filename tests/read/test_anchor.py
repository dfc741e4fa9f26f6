"""What PyTorch's own analyser (torchfrtrace, torch 2.13) answers on the real recordings in
tests/fixtures/fr, run through tests/anchor.py (about a second per run, no jobs)."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from anchor import AnchorAnswer, run_torchfrtrace

FR = Path(__file__).parents[1] / "fixtures" / "fr"
GLOO = FR / "gloo-2.13"


def _repaired(src: Path, dst: Path, world: int) -> Path:
    """A real gloo 2.13 dump with one edit: ``pg_config`` keyed as the entries name the group ("0",
    "default_pg"), with ``world`` ranks, the way the NCCL dumps of torch 2.11 record it. Gloo 2.13 records
    ``{"": {"name": "", "desc": "", "ranks": "[0, 1]"}}``, which torchfrtrace cannot look up."""
    dump = pickle.loads(src.read_bytes())
    dump["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}}
    dst.write_bytes(pickle.dumps(dump))
    return dst


@pytest.mark.parametrize(("scenario", "ext"), [("mismatch", "pkl"), ("healthy", "json")])
def test_gloo_213_dumps_are_refused(scenario, ext):
    """Every gloo 2.13 dump stops it: pg_config is keyed by "" while the entries say group "0", so its
    (group, rank) lookup fails, whether the dumps agree or not, pickled or JSON, with or without
    --allow-incomplete-ranks. (Each run imports torch: each kind once, not every pairing.)"""
    answer = run_torchfrtrace([GLOO / scenario / f"rank{r}.{ext}" for r in (0, 1)])
    assert (answer.returncode, answer.error, answer.named_ranks) == (1, "KeyError: ('0', 0)", ())
    assert "pg_name = _pg_guids[(original_pg_name, first_rank)]" in answer.output
    assert answer.line() == "torchfrtrace: no answer (KeyError: ('0', 0))"
    assert answer.command[-3:] == ("--prefix", "rank_", "--allow-incomplete-ranks") and answer.read_order in (
        (0, 1), (1, 0))
    strict = run_torchfrtrace(GLOO / scenario, allow_incomplete=False)  # the directory: rank<N>.pkl chosen over .json
    assert strict.error == "KeyError: ('0', 0)" and "--allow-incomplete-ranks" not in strict.command


def test_repaired_mismatch_names_the_rank_that_differs_from_the_first_file(tmp_path):
    for r in (0, 1):
        _repaired(GLOO / "mismatch" / f"rank{r}.pkl", tmp_path / f"rank{r}.pkl", world=2)
    answer = run_torchfrtrace(tmp_path)
    assert answer.error is None and answer.returncode == 0
    first, other = answer.read_order
    assert answer.named_ranks == (other,)
    assert "Collective sequence number: 5 has errors" in answer.output
    assert f"error msg: Culprit rank {other}; Error type: COLLECTIVE_TYPE_MISMATCH" in answer.output
    op = "all_reduce" if first == 0 else "all_gather"
    assert answer.line() == f"torchfrtrace: names rank {other} (mismatch at collective #5 {op})"


def test_first_rank_bias(tmp_path):
    """Three ranks from the two real mismatch dumps (rank 1's all_gather trace given to one rank, rank 0's
    all_reduce trace to the other two; pg_config repaired, see ``_repaired``), once for each rank as the
    odd one. torchfrtrace takes the first file the directory lists as its reference: when that is the odd
    rank it names the two innocent ranks, otherwise the odd rank alone. Names in three styles on purpose."""
    names = ("nccl_trace_rank_0", "rank1.pkl", "fr_trace_rank_2.pickle")
    named: dict[int, tuple[int, ...]] = {}
    for odd in (0, 1, 2):
        case = tmp_path / f"odd{odd}"
        case.mkdir()
        files = [_repaired(GLOO / "mismatch" / f"rank{1 if r == odd else 0}.pkl", case / names[r], world=3)
                 for r in (0, 1, 2)]
        answer = run_torchfrtrace(files)
        assert answer.error is None and sorted(answer.read_order) == [0, 1, 2]
        innocent = tuple(r for r in (0, 1, 2) if r != odd)
        if answer.read_order[0] == odd:
            assert answer.named_ranks == innocent, answer.output
            assert answer.line() == f"torchfrtrace: names ranks {innocent[0]}, {innocent[1]} " \
                                    "(mismatch at collective #5 all_gather)"
        else:
            assert answer.named_ranks == (odd,), answer.output
        named[odd] = answer.named_ranks
    assert sorted(map(len, named.values())) == [1, 1, 2]  # exactly one run blames the two innocent ranks


def test_missing_rank_dump(tmp_path):
    """Rank 1's dump absent (a real rank-0 dump, pg_config repaired): without --allow-incomplete-ranks it
    stops; with it, it names nobody and says so for every collective, completed ones included."""
    dump = _repaired(GLOO / "mismatch" / "rank0.pkl", tmp_path / "rank0.pkl", world=2)
    strict = run_torchfrtrace([dump], allow_incomplete=False)
    assert (strict.returncode, strict.error) == (1, "AssertionError: Missing dump files from ranks {1}")
    assert strict.named_ranks == ()
    lenient = run_torchfrtrace([dump])
    assert (lenient.returncode, lenient.error, lenient.named_ranks, lenient.missing_dumps) == (0, None, (), (1,))
    assert lenient.output.count("we missed FR dumps from ranks ({1})") == 5  # collectives #1..#5
    assert lenient.line() == "torchfrtrace: names no rank (cannot decide: no dumps from ranks 1)"


def test_rank_behind_is_named_missing(tmp_path):
    """Rank 2 stopped after #4 (real rank-0 dump with its last entry cut; pg_config repaired): whatever
    file comes first, it reports #5 as not joined by rank 2."""
    for r in (0, 1):
        _repaired(GLOO / "mismatch" / "rank0.pkl", tmp_path / f"rank{r}.pkl", world=3)
    behind = _repaired(GLOO / "mismatch" / "rank0.pkl", tmp_path / "rank2.pkl", world=3)
    dump = pickle.loads(behind.read_bytes())
    dump["entries"] = dump["entries"][:-1]
    behind.write_bytes(pickle.dumps(dump))
    answer = run_torchfrtrace(tmp_path)
    assert answer.error is None and answer.named_ranks == (2,), answer.output
    assert "Not all ranks joining collective, sequence number: 5" in answer.output
    assert "missing ranks: {2}" in answer.output
    assert answer.line() == "torchfrtrace: names rank 2 (not all ranks joined at collective #5 all_reduce)"


@pytest.mark.parametrize("name", ["on-timeout-dump-rank0.pickle", "pipe-dump-rank0.pickle"])
def test_h100_one_rank_hang_says_nothing(name):
    """NCCL dumps of a one-rank job hung in an all_reduce (on-timeout: #785 pending, the pipe dump: #544):
    it prints nothing and exits 0; the pending collective is not mentioned."""
    answer = run_torchfrtrace([FR / "h100" / name])
    assert (answer.returncode, answer.error, answer.named_ranks, answer.read_order) == (0, None, (), (0,))
    assert "sequence number" not in answer.output and "Culprit" not in answer.output
    assert answer.line() == "torchfrtrace: names no rank (no mismatch found)"


def test_staging_failures_are_answers(tmp_path):
    """Two pickles for one rank (the h100 folder), no dumps, a missing folder: no run, an error line."""
    assert run_torchfrtrace(FR / "h100").error == (
        "ValueError: two dumps for rank 0: on-timeout-dump-rank0.pickle, pipe-dump-rank0.pickle")
    assert run_torchfrtrace(tmp_path).error.startswith("FileNotFoundError: no Flight Recorder dumps")
    missing = run_torchfrtrace(tmp_path / "nowhere")
    assert (missing.command, missing.returncode) == ((), None) and missing.error.startswith("FileNotFoundError")
    shutil.copy(FR / "h100" / "hook-dump_fr_trace_json-nccl-job-EMPTY.json", tmp_path / "rank0.json")
    assert run_torchfrtrace(tmp_path).error.startswith("FileNotFoundError")  # JSON without entries: not a dump


def test_garbage_and_timeout_are_answers(tmp_path):
    (tmp_path / "rank0").write_text("not a pickle")
    garbage = run_torchfrtrace(tmp_path)
    assert garbage.returncode == 1 and garbage.error.startswith("_pickle.UnpicklingError")
    slow = run_torchfrtrace([GLOO / "mismatch" / "rank0.pkl"], timeout=0.01)
    assert (slow.returncode, slow.error) == (None, "timed out after 0.01s")
    assert slow.line() == "torchfrtrace: no answer (timed out after 0.01s)"


def test_output_is_capped():
    answer = AnchorAnswer(("x",), 0, "", (), None)
    assert answer.line() == "torchfrtrace: names no rank (no mismatch found)"
    from anchor import _cap

    capped = _cap("a" * 20000)
    assert len(capped) < 8300 and "characters left out" in capped
