"""One meaning per verdict kind (docs/how-trainwatch-decides.md, "The verdict kinds"), whatever rule
produced it: a hang names no culprit, a straggler always names one, healthy and unknown none."""

from __future__ import annotations

import itertools

import pytest

from trainwatch.probes.judge.verdict import judge
from trainwatch.probes.snapshot import ExitInfo, Job, KernelState, Rank

JOB = Job("torchrun", 1, "h")
STORAGE = KernelState(letter="S", syscall="openat", target="/mnt/ckpt/x.pt (fuse on /mnt/ckpt)", fs_type="fuse",
                      target_kind="file")


def rank(n: int, state: str, phase: str = "compute", **kw) -> Rank:
    return Rank(rank=n, pid=kw.pop("pid", 100 + n), state=state, phase=phase,
                where=kw.pop("where", f"train.py:{10 + n} f"), **kw)


# The shapes a rank takes, as the judge sees them: (state, phase, extra fields).
SHAPES = {
    "running": ("running", "compute", {}),
    "polling": ("running", "sleep", {}),
    "in all_reduce": ("stuck", "collective", {"op": "all_reduce", "where": "train.py:44 sync"}),
    "in all_gather": ("stuck", "collective", {"op": "all_gather", "where": "train.py:50 gather"}),
    "on its GPU": ("stuck", "gpu_wait", {"op": "item()", "where": "train.py:60 log"}),
    "in sleep": ("stuck", "sleep", {}),
    "in a child": ("stuck", "subprocess", {}),
    "on storage": ("stuck", "io", {"op": "open", "kernel": STORAGE}),
    "stopped": ("stuck", "unknown", {"kernel": KernelState(letter="T")}),
    "asleep in backward": ("stuck", "compute", {"kernel": KernelState(letter="S", syscall="futex")}),
    "unread": ("unknown", "unknown", {}),
    "missing": ("missing", "unknown", {"pid": None}),
    "killed": ("exited", "unknown", {"exit": ExitInfo(signal="SIGKILL", at=5.0)}),
    "done": ("exited", "unknown", {"exit": ExitInfo(code=0, at=5.0)}),
}


def ranks_of(shapes: tuple[str, ...]) -> list[Rank]:
    out = []
    for n, name in enumerate(shapes):
        state, phase, extra = SHAPES[name]
        out.append(rank(n, state, phase, **{"stuck_for_s": 200.0 if state == "stuck" else None, **extra}))
    return out


@pytest.mark.parametrize("shapes", list(itertools.combinations_with_replacement(SHAPES, 3)),
                         ids=lambda shapes: "+".join(shapes))
def test_each_kind_keeps_its_meaning(shapes):
    verdict = judge(ranks_of(shapes), JOB)
    if verdict.kind in ("hang", "healthy", "unknown"):
        assert verdict.culprits == (), verdict  # a hang: no rank holds the others up
    if verdict.kind in ("straggler", "crashed"):
        assert verdict.culprits, verdict


def test_a_rank_blocked_in_open_while_the_others_poll_is_a_straggler_not_a_hang():
    """The field report: rank 1 blocked in open() on a hung mount while ranks 0 and 2 poll a flag
    file. They are not hung: rank 1 holds the job up, and is named."""
    ranks = [rank(0, "running", "sleep"), rank(1, "stuck", "io", op="open", stuck_for_s=43.0, kernel=STORAGE),
             rank(2, "running", "sleep")]
    verdict = judge(ranks, JOB)
    assert (verdict.kind, verdict.culprits) == ("straggler", (1,)), verdict
    assert verdict.summary == ("rank 1 blocked 43 s in open() on /mnt/ckpt/x.pt (fuse on /mnt/ckpt) from "
                               "train.py:11 f while ranks 0,2 run on")


def test_every_rank_blocked_on_its_storage_is_a_hang_that_names_none():
    ranks = [rank(n, "stuck", "io", op="open", stuck_for_s=43.0, kernel=STORAGE) for n in range(3)]
    verdict = judge(ranks, JOB)
    assert (verdict.kind, verdict.culprits) == ("hang", ()), verdict
    assert verdict.summary.endswith("every rank waits on its storage, not on another rank")


def test_every_rank_stuck_in_its_own_work_is_a_hang_that_says_where_each_is():
    ranks = [rank(0, "stuck", "subprocess", waits_for="its child process PID 812 `sleep 60` (running 41 s)"),
             rank(1, "stuck", "sleep")]
    verdict = judge(ranks, JOB)
    assert (verdict.kind, verdict.culprits) == ("hang", ()), verdict
    assert verdict.summary == ("rank 0 at train.py:10 f waits for its child process PID 812 `sleep 60` (running "
                               "41 s); rank 1 is stuck in sleep at train.py:11 f: every rank is stuck in its own "
                               "work, none waits for another")


def test_an_unread_rank_while_the_others_wait_is_named_as_a_missing_one_is():
    ranks = [rank(0, "stuck", "collective", op="all_reduce", stuck_for_s=30.0), rank(1, "unknown", "unknown")]
    verdict = judge(ranks, JOB)
    assert (verdict.kind, verdict.culprits) == ("straggler", (1,)), verdict
    assert "rank 1 could not be read, so it may be what it waits for" in verdict.summary


ASLEEP = KernelState(letter="S", syscall="futex")


def test_a_rank_asleep_in_backward_with_no_native_sample_may_wait_for_the_one_in_its_own_work():
    """DDP's all_reduce waits inside ``backward``: without the native sample that says so (it timed
    out on a loaded node, or automatic native samples are off) rank 0's wait is unnamed, not its own
    work. The rank in its own work is the straggler, and the summary says what was not read (seen:
    "every rank is stuck in its own work" for a DDP straggler under a loaded CI)."""
    ranks = [rank(0, "stuck", "compute", stuck_for_s=9.0, kernel=ASLEEP), rank(1, "stuck", "sleep", stuck_for_s=9.0)]
    verdict = judge(ranks, JOB)
    assert (verdict.kind, verdict.culprits) == ("straggler", (1,)), verdict
    assert verdict.summary == ("rank 1 is stuck in sleep at train.py:11 f while rank 0 is asleep in compute at "
                               "train.py:10 f in a wait its Python stack does not name (no native sample was read: "
                               "a collective may wait there, as DDP's all_reduce does inside backward)")


def test_a_native_sample_or_a_named_wait_makes_it_the_rank_s_own_again():
    """Once a native sample said compute (or the kernel named a child it waits for), it is its own work."""
    for extra in ({"native": True}, {"waits_for": "its child process PID 812 `sleep 60` (running 41 s)"},
                  {"kernel": KernelState(letter="R")}):
        ranks = [rank(0, "stuck", "compute", stuck_for_s=9.0, **{"kernel": ASLEEP, **extra}), rank(1, "stuck", "sleep")]
        verdict = judge(ranks, JOB)
        assert (verdict.kind, verdict.culprits) == ("hang", ()), (extra, verdict)
        assert verdict.summary.endswith("every rank is stuck in its own work, none waits for another"), verdict


def test_every_rank_asleep_in_an_unnamed_wait_is_a_hang_that_says_so():
    ranks = [rank(n, "stuck", "compute", stuck_for_s=9.0, kernel=ASLEEP) for n in range(2)]
    verdict = judge(ranks, JOB)
    assert (verdict.kind, verdict.culprits) == ("hang", ()), verdict
    assert verdict.summary.endswith("every rank is asleep in a wait its Python stack does not name (a native "
                                    "sample names it: `n` in the live view, or --native)"), verdict


def test_a_rank_stuck_in_its_own_work_beside_an_unread_one_is_named_not_a_hang():
    """A 2-node job read from a login node: rank 1 stuck in its own work, rank 0 (the other node,
    read through srun) not judged under load. "hang" would claim no rank holds another up, which the
    unread rank leaves open; the one stuck in its own work is the one the job would wait for (seen in CI)."""
    ranks = [rank(0, "unknown", "unknown"), rank(1, "stuck", "sleep", stuck_for_s=30.0)]
    verdict = judge(ranks, JOB)
    assert (verdict.kind, verdict.culprits) == ("straggler", (1,)), verdict
    assert verdict.summary == ("rank 1 is stuck in sleep at train.py:11 f while rank 0 could not be read, so whether "
                               "it waits for it is not known (see the notes for why)")
