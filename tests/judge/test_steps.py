"""The step reader on py-spy's `dump --json --locals` shape (as py-spy 0.4 prints it), the step
clock, and the words: only allowed integer locals of user frames and the HF loop survive."""

from __future__ import annotations

from dataclasses import replace

from trainwatch.probes.judge.steps import (
    StepClock, StepReader, slow_step_warnings, step_from_locals, step_label, step_note,
)
from trainwatch.probes.read.processes.procfs import ThreadCounters
from trainwatch.probes.read.stacks.pyspy import parse_dump, parse_locals
from trainwatch.probes.snapshot import Frame, Rank

PID = 4242
SITE = "/venv/lib/python3.11/site-packages"
SECRET = "sk-live-0123456789abcdef"


def frame(name: str, filename: str, **locals_: str) -> dict:
    return {"name": name, "filename": filename, "module": None, "line": 10, "is_entry": False,
            "locals": [{"name": k, "addr": 1, "arg": False, "repr": v} for k, v in locals_.items()]}


def dump(*frames: dict, other_thread: list[dict] | None = None) -> list[dict]:
    threads = [{"pid": PID, "thread_id": 1, "thread_name": "MainThread", "os_thread_id": PID,
                "active": False, "owns_gil": False, "frames": list(frames)}]
    if other_thread is not None:
        threads.insert(0, {"pid": PID, "thread_id": 2, "thread_name": "worker", "os_thread_id": PID + 1,
                           "frames": other_thread})
    return threads


def read(data: list[dict]) -> int | None:
    main = parse_dump(data, PID)[0]
    return step_from_locals(main.frames, parse_locals(data, PID))


def test_only_allowed_integer_locals_of_user_frames_are_kept():
    data = dump(
        frame("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", step="99", group="<PG at 0x1>"),
        frame("train", "/work/train.py", step="1204", api_key="987654321", step_token=f'"{SECRET}"',
              epoch=f'"{SECRET}"', iteration="True", it="1.5", i="+bigint", global_step="-1"),
        frame("<module>", "/work/train.py", argv="None"),
        other_thread=[frame("loop", "/work/train.py", global_step="7")],
    )
    ints = parse_locals(data, PID)
    assert ints == {1: {"step": 1204, "global_step": -1}}  # the torch frame, the thread, the rest: gone
    assert SECRET not in repr(ints) and "987654321" not in repr(ints)
    assert read(data) == 1204  # -1 is no step


def test_name_priority_and_the_outermost_frame_on_a_tie():
    data = dump(
        frame("layer", "/work/model.py", i="3"),
        frame("train_epoch", "/work/train.py", batch_idx="17", step="17", epoch="2"),
        frame("main", "/work/train.py", step="5", epoch="2"),
    )
    assert read(data) == 5  # `step` in two frames: the outer loop's
    data = dump(frame("layer", "/work/model.py", i="3"), frame("main", "/work/train.py", epoch="2"))
    assert read(data) == 2  # `epoch` beats `i`
    assert read(dump(frame("layer", "/work/model.py", i="3"))) == 3  # `i` when nothing better
    assert read(dump(frame("main", "/work/train.py", steps="3", count="9"))) is None
    data = dump(frame("train", "/work/train.py", step="40", global_step="1230"))
    assert read(data) == 1230


def test_hf_trainer_loop():
    trainer = f"{SITE}/transformers/trainer.py"
    new = dump(frame("training_step", trainer, step="1"),
               frame("Trainer._run_epoch", trainer, epoch="2", update_step="14", num_update_steps_per_epoch="100",
                     step="59", steps_in_epoch="400"),
               frame("main", "/work/finetune.py", i="9"))
    # py-spy names it Trainer._run_epoch; the optimizer step in progress, 1-based like global_step
    # (update_step 14 is the 15th step of epoch 2); the user's `i` loses to the HF loop.
    assert read(new) == 215
    older = dump(frame("_inner_training_loop", trainer, epoch="1", step="9", total_batched_samples="409"))
    assert read(older) == 409
    oldest = dump(frame("_inner_training_loop", trainer, epoch="1", step="9", steps_in_epoch="400"))
    assert read(oldest) == 410
    assert read(dump(frame("evaluate", trainer, step="3"))) is None  # other Trainer frames: nothing


def test_clock_period_divides_by_the_steps_between_reads():
    clock = StepClock()
    for now, step in ((0.0, 10), (1.0, 12), (3.0, 16), (4.0, 18), (4.5, 18)):
        clock.observe(7, step, now)
    assert clock.history(7) == [0.5, 0.5]  # the first change has no start to measure from
    assert clock.period(7) is None  # two intervals: not yet a rhythm (one slow step would set it)
    clock.observe(7, 22, 6.0)  # a slow stretch: 4 steps in 2 s
    assert clock.step(7) == 22 and clock.last_change(7) == 6.0
    assert clock.period(7) == 0.5 and clock.held_for(7) == 0.0  # the median of 0.5, 0.5, 0.5
    clock.observe(7, 24, 7.0)
    clock.observe(7, 24, 7.5)
    assert clock.history(7)[-1] == 0.5 and clock.held_for(7) == 0.5
    clock.observe(7, 0, 6.0)  # a new epoch's counter: a change, no interval
    assert clock.period(7) == 0.5 and clock.step(7) == 0
    clock.still(7, 9.0)
    assert clock.held_for(7) == 3.0
    assert StepClock().period(1) is None


def test_reader_reads_only_when_the_step_can_have_changed():
    reader = StepReader(every=3)
    idle = ThreadCounters(5, 5, 5)
    assert reader.due(1, idle, 0.0)
    reader.next_round()
    reader.observe(1, (Frame("train", "/work/train.py"),), {0: {"step": 3}}, idle, 0.0)
    reader.next_round()
    assert not reader.due(1, idle, 1.0, force=True)  # has not run since: same step, no dump
    busy = ThreadCounters(6, 9, 5)
    assert not reader.due(1, busy, 1.0)
    assert reader.due(1, busy, 1.0, force=True)
    reader.next_round()
    reader.next_round()
    assert reader.due(1, busy, 2.0)
    assert reader.fields(1) == (3, None, None)  # no change of step seen yet: no period, no time held


def rank(number: int, step: int | None, state: str = "running") -> Rank:
    return Rank(rank=number, pid=100 + number, state=state, step=step)


def test_step_note_names_the_ranks_behind():
    assert step_note([rank(0, 1205), rank(1, 1205), rank(2, 1204)]) == \
        "rank 2 is at step 1,204 while ranks 0-1 are at step 1,205"
    assert step_note([rank(0, 9), rank(1, 9), rank(2, 7), rank(3, 8)]) == \
        "rank 2 is at step 7, rank 3 at step 8 while ranks 0-1 are at step 9"
    assert step_note([rank(0, 5), rank(1, 5), rank(2, None), rank(3, 4, state="exited")]) is None
    assert step_label(1204, 2.61) == "1,204 (2.6s/step)" and step_label(None, 1.0) is None


def test_slow_step_warning_only_for_a_rank_left_behind():
    clock = StepClock()
    for pid, steps in ((100, (8, 9, 10, 11, 12)), (101, (8, 9, 10, 11, 13)), (102, (8, 9, 10, 11, 12))):
        for now, step in zip((-5.2, -2.6, 0.0, 2.6, 5.2), steps):
            clock.observe(pid, step, now)
    clock.still(100, 14.3)
    clock.still(102, 14.3)
    clock.observe(101, 13, 14.3)
    reader = StepReader()
    reader.clock = clock

    def read(number: int, step: int) -> object:  # the rank as the live view fills it from the clock
        _, period, held = reader.fields(100 + number)
        return replace(rank(number, step), step_period_s=period, step_held_s=held)

    ranks = [read(0, 12), read(1, 13), read(2, 12)]
    warnings = slow_step_warnings(ranks, min_s=3.0)
    assert warnings == ["rank 0: step 12 has taken 9.1 s, 3.5x its usual 2.6 s",
                        "rank 2: step 12 has taken 9.1 s, 3.5x its usual 2.6 s"]
    assert slow_step_warnings(ranks, min_s=10.0) == []  # shorter than the window
    level = [read(0, 12), read(1, 12), read(2, 12)]
    assert slow_step_warnings(level, min_s=3.0) == []  # nobody went further: the verdict's job


def test_steps_shown_in_summary_md_and_the_plain_table():
    from rich.console import Console

    from trainwatch.probes.evidence.summary import render
    from trainwatch.probes.snapshot import Job, Snapshot
    from trainwatch.tui.render import render_table
    from trainwatch.tui.widgets.history import History

    snap = Snapshot(job=Job(launcher="torchrun", pid=1, host="node1"),
                    ranks=(Rank(rank=0, pid=10, step=1205, step_period_s=2.61), Rank(rank=1, pid=11)))
    summary = render(snap, [], [], reason=None, redacted=True, sources={})
    assert "| 0 | 10 | unknown | 1,205 (2.6s/step) |" in summary and "| 1 | 11 | unknown | n/a |" in summary
    console = Console(width=160, record=True)
    console.print(render_table(snap))
    assert "1,205 (2.6s/step)" in console.export_text()
    history = History(length=2)
    for _ in range(3):
        history.record(snap)
    assert history.step_period(snap.ranks[0].key) == [2.61, 2.61]
    assert history.step_period(snap.ranks[1].key) == [None, None]
