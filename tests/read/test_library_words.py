"""A collective library's own words, read from what real gloo jobs printed (torch 2.13, CPU)."""

from __future__ import annotations

from pathlib import Path

from trainwatch.probes.read.logs import crashlog
from trainwatch.probes.read.logs.library_words import abort_lines, library_error
from trainwatch.probes.read.logs.ranklog import RankLogs, rank_lines

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def test_gloos_size_check_names_the_bytes_that_arrived_and_those_expected():
    """Rank 0's own output (`trainwatch run`) as gloo aborted it: `10 vs 8` is what arrived, then
    what its own all_gather expected (GLOO_ENFORCE_LE(a, b) prints `a vs b`)."""
    lines = (LOGS / "gloo-2.13-size-mismatch-rank0-output.log").read_text().splitlines()
    said = library_error(lines)
    assert said is not None and said.library == "gloo" and said.mismatch
    assert (said.received_bytes, said.expected_bytes) == (10, 8)
    assert said.words.startswith("Received data size doesn't match expected size")
    assert crashlog.fatal_line(lines)[0] == "collective mismatch (gloo)"  # not merely "aborted"


def test_a_shared_logs_abort_is_unprefixed_and_given_only_to_a_rank_that_aborted():
    """torchrun's shared output: C++ writes `terminate called …` with no [rankN]: prefix."""
    path = LOGS / "gloo-2.13-size-mismatch-torchrun.log"
    lines = path.read_text().splitlines()
    assert len(abort_lines(lines)) == 2
    assert library_error(rank_lines(lines, 2, 2, own=False)) is None  # not among rank 2's own lines
    logs = RankLogs()
    logs.note_writer(1, str(path))
    logs.note_writer(2, str(path))
    assert logs.library_error(str(path), 2, 2, aborted=True).received_bytes == 10
    assert logs.library_error(str(path), 0, 0, aborted=False) is None  # rank 0 only lost its peer


def test_c10ds_fingerprints_name_each_ranks_call():
    """TORCH_DISTRIBUTED_DEBUG=DETAIL: each rank's error names its own call and one peer's."""
    lines = (LOGS / "c10d-2.13-detail-mismatch-torchrun.log").read_text().splitlines()
    calls = {}
    for rank in range(3):
        said = library_error(rank_lines(lines, rank, rank, own=False))
        assert said is not None and said.library == "c10d" and said.mismatch
        assert "shapes" in said.words
        for row in said.calls:
            calls[row.rank] = (row.calls[0].op, row.calls[0].sizes, row.calls[0].dtype)
    assert calls == {0: ("all_gather", "[4]", "Float"), 1: ("all_gather", "[5]", "Float"),
                     2: ("all_gather", "[4]", "Float")}


def test_nccls_words_are_kept_without_inventing_a_mismatch():
    said = library_error(["RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there "
                          "was a network error, NCCL version 2.21.5", "ncclRemoteError: A call failed possibly due "
                          "to a network error or a remote process exiting prematurely."])
    assert said is not None and said.library == "NCCL" and not said.mismatch and not said.calls
    assert said.words.startswith("ncclRemoteError")
    assert library_error(["RuntimeError: planted failure at step 3"]) is None
