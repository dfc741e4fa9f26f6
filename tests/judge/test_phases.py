"""The classifier on recorded py-spy JSON, and the verdict on hand-built ranks."""

from __future__ import annotations

import json
from pathlib import Path

from trainwatch.probes.judge.groups import group_ranks
from trainwatch.probes.judge.phases import classify
from trainwatch.probes.judge.verdict import judge
from trainwatch.probes.read.stacks.pyspy import parse_dump
from trainwatch.probes.snapshot import ExitInfo, Frame, Job, Rank, ThreadStack

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pyspy"


def recorded(name: str) -> list[ThreadStack]:
    data = json.loads((FIXTURES / name).read_text())
    main_pid = next(t["os_thread_id"] for t in data if t["thread_name"] == "MainThread")
    return parse_dump(data, main_pid)


def test_recorded_gloo_all_gather_is_a_collective_at_the_user_line():
    result = classify(recorded("gloo_all_gather.json"))
    assert (result.phase, result.op) == ("collective", "all_gather")
    assert result.where == "train.py:50 sync_metrics" and result.user_frame == "train.py:50 sync_metrics"


def test_native_frames_are_marked_and_do_not_change_the_answer():
    threads = recorded("gloo_all_gather_native.json")
    main = threads[0]
    assert main.is_main and any(f.native for f in main.frames) and not all(f.native for f in main.frames)
    assert any("c10d::Work::wait" in f.function for f in main.frames if f.native)
    assert classify(threads).op == "all_gather"


def stack(*frames: tuple[str, str, int], active: bool = False) -> list[ThreadStack]:
    return [ThreadStack("MainThread", tid=1, is_main=True, active=active,
                        frames=tuple(Frame(fn, path, line) for fn, path, line in frames))]


SITE = "/venv/lib/python3.11/site-packages"


def test_collective_through_a_trainer_library_points_at_the_trainer_line():
    threads = stack(("_allgather_base", f"{SITE}/torch/distributed/distributed_c10d.py", 3000),
                    ("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
                    ("gather", f"{SITE}/accelerate/utils/operations.py", 400),
                    ("concatenated_forward", f"{SITE}/trl/trainer/cpo_trainer.py", 712),
                    ("train", "/home/me/train.py", 20))
    result = classify(threads)
    assert (result.phase, result.op) == ("collective", "_allgather_base")
    assert result.where == "cpo_trainer.py:712 concatenated_forward"
    assert result.user_frame == "train.py:20 train"


def test_a_collective_torch_calls_from_another_is_named_by_the_one_called():
    """torch 2.13's gloo `all_gather_into_tensor` (recorded: tests/gpu/nccl_paths.py on CPU) calls
    `all_gather_single` through a second c10d_logger wrapper and typing_extensions' `deprecated`:
    the op is the call the user made, not "collective"."""
    threads = stack(("all_gather_single", f"{SITE}/torch/distributed/distributed_c10d.py", 4394),
                    ("_exception_logger.<locals>.wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
                    ("all_gather_into_tensor", f"{SITE}/torch/distributed/distributed_c10d.py", 4413),
                    ("deprecated.__call__.<locals>.wrapper", f"{SITE}/typing_extensions.py", 3140),
                    ("_exception_logger.<locals>.wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 83),
                    ("<module>", "/w/nccl_paths.py", 51))
    assert (classify(threads).phase, classify(threads).op) == ("collective", "all_gather_into_tensor")


def test_dataloader_and_checkpoint_and_init():
    # multiprocessing's queue is innermost; the DataLoader frame above it decides
    loader = stack(("get", "/usr/lib/python3.11/multiprocessing/queues.py", 113),
                   ("_try_get_data", f"{SITE}/torch/utils/data/dataloader.py", 1100),
                   ("train", "/w/train.py", 9))
    assert classify(loader).phase == "dataloader"
    save = stack(("_save", f"{SITE}/torch/serialization.py", 800), ("save_ckpt", "/w/train.py", 30))
    assert classify(save).phase == "checkpoint" and classify(save).where == "train.py:30 save_ckpt"
    init = stack(("init_process_group", f"{SITE}/torch/distributed/distributed_c10d.py", 1500),
                 ("setup", "/w/train.py", 5))
    assert classify(init).phase == "init"


def test_a_thread_waiting_in_threading_is_a_lock():
    threads = stack(("wait", "/usr/lib/python3.11/threading.py", 320), ("flush", "/w/train.py", 70))
    assert classify(threads).phase == "lock"
    assert classify(threads).where == "train.py:70 flush"


def rank(n: int, state: str, phase: str, op: str | None = None, where: str | None = None, **kw) -> Rank:
    return Rank(rank=n, pid=100 + n, state=state, phase=phase, op=op, where=where, **kw)


def test_verdicts():
    job = Job("torchrun", 1, "h")
    ar = dict(op="all_reduce", where="train.py:44 sync")
    healthy = [rank(i, "running", "compute") for i in range(4)]
    assert judge(healthy, job).kind == "healthy"
    straggler = [rank(i, "stuck", "collective", **ar) for i in range(3)] + [rank(3, "stuck", "dataloader", where="train.py:75 step")]
    v = judge(straggler, job)
    assert (v.kind, v.culprits) == ("straggler", (3,))
    assert v.summary.startswith("rank 3 is in the DataLoader at train.py:75 step while ranks 0-2 wait in all_reduce")
    mismatch = [rank(i, "stuck", "collective", **ar) for i in range(7)] + [rank(7, "stuck", "collective", op="all_gather", where="train.py:88 m")]
    v = judge(mismatch, job)
    assert (v.kind, v.culprits) == ("mismatch", (7,))
    assert "rank 7 is in all_gather at train.py:88 m while ranks 0-6 wait in all_reduce" in v.summary
    hang = [rank(i, "stuck", "collective", stuck_for_s=30.0, **ar) for i in range(4)]
    v = judge(hang, job)
    assert (v.kind, v.culprits) == ("hang", ()) and "no local culprit" in v.summary
    crashed = [rank(0, "exited", "collective", exit=ExitInfo(code=1)),
               rank(1, "exited", "compute", exit=ExitInfo(signal="SIGSEGV", first=True)),
               rank(2, "exited", "collective", exit=ExitInfo(signal="SIGTERM"))]
    v = judge(crashed, job)
    assert (v.kind, v.culprits) == ("crashed", (1,)) and "SIGSEGV" in v.summary
    init = [rank(0, "stuck", "init", op="init_process_group", where="train.py:5 setup"), rank(1, "missing", "unknown")]
    v = judge(init, job)
    assert (v.kind, v.culprits) == ("rendezvous", (1,)) and "never joined" in v.summary
    done = [rank(i, "exited", "unknown", exit=ExitInfo(code=0)) for i in range(2)]
    assert judge(done, job).kind == "healthy"


def test_groups_are_compact_and_biggest_first():
    ranks = [rank(i, "stuck", "collective", op="all_reduce", where="a") for i in (0, 1, 2, 3, 5, 6)]
    ranks += [rank(4, "stuck", "dataloader", where="b")]
    groups = group_ranks(ranks, culprits=[4])
    assert [(g.label, g.culprit) for g in groups] == [("0-3,5-6", False), ("4", True)]


def test_ranks_that_died_are_grouped_by_where_their_last_stack_put_them():
    """Killed in the all_reduce, or in the sleep the others waited for: two groups, one culprit;
    deaths with no last stack stay one group by how they ended."""
    last = [rank(0, "exited", "collective", op="all_reduce", where="t.py:78 sync", exit=ExitInfo(signal="SIGTERM")),
            rank(1, "exited", "collective", op="all_reduce", where="t.py:78 sync", exit=ExitInfo(signal="SIGTERM")),
            rank(2, "exited", "sleep", where="t.py:323 train", exit=ExitInfo(signal="SIGTERM"))]
    groups = group_ranks(last, culprits=[2])
    assert [(g.label, g.op, g.where, g.culprit) for g in groups] == [
        ("0-1", "SIGTERM in all_reduce", "t.py:78 sync", False), ("2", "SIGTERM in sleep", "t.py:323 train", True)]
    unread = [rank(i, "exited", "unknown", exit=ExitInfo(signal="SIGTERM")) for i in range(3)]
    assert [(g.label, g.op) for g in group_ranks(unread)] == [("0-2", "SIGTERM")]


def test_backward_and_forward_are_compute_even_when_the_thread_waits():
    back = stack(("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 768),
                 ("backward", f"{SITE}/torch/autograd/__init__.py", 347),
                 ("backward", f"{SITE}/torch/_tensor.py", 581),
                 ("compute_step", "/w/train.py", 35))
    result = classify(back)
    assert (result.phase, result.op, result.where) == ("compute", "backward", "train.py:35 compute_step")
    fwd = stack(("forward", f"{SITE}/torch/nn/modules/linear.py", 125),
                ("_call_impl", f"{SITE}/torch/nn/modules/module.py", 1747), ("step", "/w/train.py", 30))
    assert classify(fwd).op == "forward"


def test_summaries_agree_in_number():
    job = Job("torchrun", 1, "h")
    two = [rank(0, "stuck", "collective", op="all_reduce", where="a"), rank(1, "stuck", "collective", op="all_gather", where="b")]
    tie = judge(two, job)
    assert (tie.kind, tie.culprits) == ("mismatch", ())  # one against one: no coin toss
    assert tie.summary == "ranks disagree: rank 0 is in all_reduce at a; rank 1 is in all_gather at b"
    # A place no other rank ever visited while healthy breaks the tie: both went through 'a' every step.
    known = judge(two, job, familiar={0: frozenset({"a"}), 1: frozenset({"a"})})
    assert (known.kind, known.culprits) == ("mismatch", (1,))
    assert known.summary == "rank 1 is in all_gather at b while rank 0 waits in all_reduce at a"
    three = two + [rank(2, "stuck", "collective", op="all_gather", where="b")]
    assert judge(three, job).summary == "rank 0 is in all_reduce at a while ranks 1-2 wait in all_gather at b"
    lone = [rank(0, "stuck", "collective", op="all_reduce", where="a"), rank(1, "stuck", "sleep", where="c")]
    assert judge(lone, job).summary == "rank 1 is in sleep at c while rank 0 waits in all_reduce at a"


def test_a_lock_taken_by_with_is_a_lock_whatever_its_name():
    """`with metrics_lock:` read as "unknown" while `metrics_lock.acquire()` on the same line was a
    lock (the old pattern wanted the word `lock` alone)."""
    idle = ThreadStack("MainThread", 1, (Frame("push_metrics", "/job/train.py", 40),), active=False, is_main=True)
    for line in ("with metrics_lock:", "with self._cv:", "with state.mutex:", "with sem:", "with threading.Lock():",
                 "metrics_lock.acquire()", "done.wait()"):
        got = classify([idle], source_line=lambda frame, text=line: text)
        assert (got.phase, got.op) == ("lock", "acquire"), line
    for line in ("with open(path) as f:", "with torch.no_grad():", "total = seconds  # not a lock"):
        assert classify([idle], source_line=lambda frame, text=line: text).phase == "unknown", line
