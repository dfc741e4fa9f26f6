"""A rank a collective library failed is a witness: the culprit is the rank whose call differs (no jobs)."""

from __future__ import annotations

from trainwatch.probes.judge.judgement import JudgeMemory, judge_job
from trainwatch.probes.judge.phases import where_frame
from trainwatch.probes.observed import ObservedJob, observed_rank
from trainwatch.probes.snapshot import (CollectiveCall, CollectiveState, ExitInfo, Frame, Job, LibraryError, Rank,
                                        RankCollective)

GLOO = LibraryError("gloo", "Received data size doesn't match expected size. Is there a distributed collective "
                            "mismatch in your code?", mismatch=True, received_bytes=10, expected_bytes=8)
TORN = ExitInfo(code=1, at=100.1, reason="a peer rank closed its connection", frame="train.py:13 gather")


def aborted(library: LibraryError = GLOO) -> ExitInfo:
    return ExitInfo(signal="SIGABRT", at=100.0, reason="collective mismatch (gloo)", message=library.words,
                    frame="train.py:13 gather", library=library)


def dead(n: int, info: ExitInfo, **kw) -> Rank:
    return Rank(rank=n, pid=100 + n, state="exited", exit=info, **kw)


def recorded(sizes: dict[int, str], seq: int = 5) -> CollectiveState:
    rows = tuple(RankCollective(rank=r, last_enqueued=seq, last_completed=seq - 1,
                                calls=(CollectiveCall(seq - 1, "all_reduce", "[16]", "Float", done=True),
                                       CollectiveCall(seq, "all_gather", size, "Float")))
                 for r, size in sizes.items())
    return CollectiveState(source="last-words", ranks=rows)


def judged(ranks: list[Rank], collectives: CollectiveState | None = None):
    evidence = ObservedJob(job=Job("torchrun", 1, "h"), ranks=tuple(observed_rank(r) for r in ranks),
                           collectives=collectives)
    return judge_job(evidence, JudgeMemory(), 200.0).verdict


def test_the_rank_that_sent_the_bigger_size_is_named_not_the_one_gloo_aborted():
    """Rank 0 received rank 2's bigger chunk and was aborted; its own record died with it. Ranks 1
    and 2 disagree one against one; rank 0 received more than it expected, so its call is on the
    smaller side: rank 2 is the odd one out."""
    verdict = judged([dead(0, aborted()), dead(1, TORN), dead(2, TORN)], recorded({1: "[4]", 2: "[5]"}))
    assert verdict.kind == "crashed" and verdict.culprits == (2,), verdict
    assert "rank 2 enqueued all_gather of [5] #5" in verdict.summary
    assert "gloo aborted rank 0 (killed by SIGABRT): “Received data size doesn't match expected size" in verdict.summary
    assert "10 bytes arrived where its call expected 8" in verdict.summary
    assert "rank 1 then ended too" in verdict.summary


def test_the_rank_gloo_aborted_is_the_odd_one_when_every_other_rank_agrees():
    """The odd rank's chunk was the smaller: it received a bigger one from a peer, and gloo aborted
    it; every other rank's record holds the same call."""
    verdict = judged([dead(0, TORN), dead(1, aborted()), dead(2, TORN)], recorded({0: "[4]", 2: "[4]"}))
    assert verdict.culprits == (1,), verdict
    assert "rank 1's all_gather #5 expected 8 bytes where ranks 0,2 sent 10" in verdict.summary


def test_a_record_missing_for_another_rank_decides_nothing():
    """Only one other rank's record: the aborted rank cannot be told odd from it alone."""
    verdict = judged([dead(0, TORN), dead(1, aborted()), dead(2, TORN)], recorded({0: "[4]"}))
    assert verdict.culprits == () and "cannot be told" in verdict.summary, verdict


def test_c10ds_fingerprints_name_the_minority_whoever_raised_first():
    def said(own: int, own_size: str, peer: int, peer_size: str) -> ExitInfo:
        rows = tuple(RankCollective(rank=r, pg="c10d", calls=(CollectiveCall(3, "all_gather", s, "Float"),))
                     for r, s in ((own, own_size), (peer, peer_size)))
        words = "Detected mismatch between collectives on ranks; collectives differ in: Tensor Tensor shapes"
        return ExitInfo(code=1, at=100.0 + own / 10, reason="collective mismatch (c10d)", frame="train.py:13 gather",
                        library=LibraryError("c10d", words, mismatch=True, calls=rows))
    verdict = judged([dead(0, said(0, "[4]", 1, "[5]")), dead(1, said(1, "[5]", 0, "[4]")),
                      dead(2, said(2, "[4]", 1, "[5]"))])
    assert verdict.culprits == (1,), verdict
    assert "c10d raised on ranks 0-2" in verdict.summary and "rank 1 called it at train.py:13 gather" in verdict.summary


def test_without_records_the_last_stacks_may_still_tell_the_odd_call():
    """Rank 2 called all_reduce at another line while the others all_gather: the minority place."""
    verdict = judged([dead(0, aborted(), phase="collective", op="all_gather", where="train.py:13 gather"),
                      dead(1, TORN, phase="collective", op="all_gather", where="train.py:13 gather"),
                      dead(2, TORN, phase="collective", op="all_reduce", where="train.py:40 metrics")])
    assert verdict.culprits == (2,), verdict
    assert "rank 2 was in all_reduce at train.py:40 metrics while ranks 0-1 were in all_gather" in verdict.summary


def test_no_evidence_names_no_culprit_and_says_so():
    verdict = judged([dead(0, aborted()), dead(1, TORN), dead(2, TORN)])
    assert verdict.kind == "crashed" and verdict.culprits == (), verdict
    assert verdict.summary.startswith("a collective mismatch: gloo aborted rank 0")
    assert "`trainwatch run` records it" in verdict.summary


def test_a_crash_without_a_librarys_words_is_judged_as_before():
    raised = ExitInfo(code=1, at=100.0, reason="RuntimeError", message="RuntimeError: boom")
    verdict = judged([dead(0, TORN), dead(1, raised), dead(2, TORN)])
    assert verdict.culprits == (1,) and "RuntimeError: boom" in verdict.summary


def test_a_librarys_decorator_is_never_the_place():
    """typing_extensions' `deprecated` wraps torch's `_all_gather_base`: the place is the caller's line."""
    frames = (Frame("all_gather_into_tensor", "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 4),
              Frame("deprecated.__call__.<locals>.wrapper", "/v/lib/python3.11/site-packages/typing_extensions.py", 3140),
              Frame("sync", "/job/train.py", 13))
    assert where_frame(frames).label() == "train.py:13 sync"
