"""The plain table (`trainwatch snapshot`, `demo --no-tui`) fits its width: at 80 columns (a pipe, a
redirect, a small terminal) rank, state with its stuck time, phase/op and `where` stay whole; pid,
RSS, GPU, CPU% and step go first. One golden file per sample and width (80, 120); `--wide` keeps
every column. Regenerate after a deliberate change: TRAINWATCH_UPDATE_GOLDEN=1 pytest this file."""

from __future__ import annotations

import io
import os
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from trainwatch.probes.snapshot import KernelState, PeerProcess, Verdict
from trainwatch.probes.judge.groups import group_ranks
from trainwatch.tui.render import DROP_ORDER, RanksTable, render_table, wide_width
from tui_samples import ddp_straggler, gpu_wait, straggler

GOLDEN = Path(__file__).parent / "golden"
WIDTHS = (80, 120)


def child_wait():
    """Rank 3 waits for an upload that never ends; steps, GPUs and long frames everywhere."""
    base = gpu_wait()
    child = KernelState(letter="S", syscall="wait4", target="child PID 812", target_kind="child", peers_known=True,
                        peers=(PeerProcess(812, "git push origin main", 252.0),))
    what = "its child process PID 812 `git push origin main` (running 4 min)"
    ranks = tuple(replace(r, where="transformers/trainer.py:2481 _inner_training_loop") if r.rank != 3 else
                  replace(r, phase="subprocess", op=None, kernel=child, waits_for=what,
                          where="checkpointing.py:57 save_and_upload_checkpoint") for r in base.ranks)
    summary = (f"rank 3 at checkpointing.py:57 save_and_upload_checkpoint waits for {what} while ranks 0-2 "
               "wait in all_reduce at transformers/trainer.py:2481 _inner_training_loop")
    return replace(base, ranks=ranks, groups=group_ranks(ranks, (3,)),
                   verdict=Verdict("straggler", (3,), summary, since=base.verdict.since))


SAMPLES = {"straggler": straggler, "ddp": ddp_straggler, "gpu_wait": gpu_wait, "child": child_wait}


def rendered(snapshot, width: int, wide: bool = False) -> str:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(render_table(snapshot, wide=wide))
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", list(SAMPLES))
def test_the_table_matches_its_golden_file(name, width):
    text = rendered(SAMPLES[name](), width)
    golden = GOLDEN / f"table-{name}-{width}.txt"
    if os.environ.get("TRAINWATCH_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden.name}:\n{text}"


@pytest.mark.parametrize("name", list(SAMPLES))
def test_at_80_columns_where_and_the_stuck_time_stay_whole(name):
    snapshot = SAMPLES[name]()
    text = rendered(snapshot, 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    rows = text.split("\nrank ", 1)[1].splitlines()
    for rank in snapshot.ranks:
        row = next(line for line in rows if line.strip().lstrip("▶ ").startswith(f"{rank.rank} "))
        assert f"stuck ≥{int(rank.stuck_for_s)}s" in row, row
        joined = " ".join(rows)  # a long `where` wraps inside its column, never cut
        assert all(part in joined for part in (rank.where or "").split()), (rank.where, text)
    plan = RanksTable(snapshot).plan(80)
    assert {"rank", "state", "where"} <= set(plan) and ("phase" in plan or "what" in plan), plan
    present = [key for key in DROP_ORDER if key in RanksTable(snapshot, wide=True).plan(80)]
    gone = [key for key in present if key not in plan]
    assert gone == present[: len(gone)], plan  # pid first, then RSS, GPU, CPU%, step


def test_wide_keeps_every_column():
    snapshot = child_wait()
    text = rendered(snapshot, max(80, wide_width(snapshot)), wide=True)
    heading = next(line for line in text.splitlines() if line.startswith("rank "))
    assert heading.split() == ["rank", "pid", "state", "phase", "op", "where", "step", "cpu%", "rss", "gpu"]
    assert "transformers/trainer.py:2481 _inner_training_loop  1,200" in text  # no cell cut or wrapped


def test_snapshot_wide_is_an_option():
    from trainwatch.tui.cli import build_parser
    args = build_parser("snapshot").parse_args(["snapshot", "1", "--wide"])
    assert args.wide is True
