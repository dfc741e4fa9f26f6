"""The ranks table fits its width: nothing cut at the edge, the rank column pinned, styles shared."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainwatch.tui.widgets import lines
from trainwatch.tui.widgets.ranks import COLUMNS_ALWAYS, OPTIONAL, RanksTable, plan_columns

from test_tui_app import make_app, screen_text, until
from tui_samples import gpu_wait, healthy, straggler

HEADINGS = {c.heading for c in OPTIONAL} | {"rank", "state", "phase", "op", "where"}


def header_line(app) -> str:
    """The ranks table's heading row."""
    rows = screen_text(app).splitlines()
    return next(rows[i + 1] for i, line in enumerate(rows) if line.lstrip("━─").startswith("ranks"))


@pytest.mark.parametrize("width, with_step, wanted", [
    (80, False, ["rank", "state", "phase", "op", "where"]),
    (80, True, ["rank", "state", "phase", "op", "where"]),  # no room for the step: the detail has it
    (100, False, ["rank", "state", "phase", "op", "where", "cpu"]),
    (120, False, ["rank", "state", "phase", "op", "where", "cpu", "gpu", "gmem"]),
    (120, True, ["rank", "state", "phase", "op", "where", "cpu", "step", "gpu"]),
    (160, False, ["rank", "state", "phase", "op", "where", "cpu", "gpu", "gmem", "rss", "pid"]),
])
def test_columns_fit_the_width_and_where_keeps_room(width, with_step, wanted):
    plan = plan_columns(width, 4, with_step)
    assert [c.key for c in plan] == wanted
    assert sum(c.width + 2 for c in plan) <= width - 1  # padding and the scrollbar included
    assert next(c for c in plan if c.key == "where").width >= 30
    assert [c.key for c in plan][:len(COLUMNS_ALWAYS)] == list(COLUMNS_ALWAYS)


def test_the_state_is_as_wide_as_a_stuck_time_and_gpu_columns_need_a_reading():
    longest = len("stuck ≥12m34s")
    for width in (80, 120, 160):
        plan = {c.key: c.width for c in plan_columns(width, 4, False, state_width=longest)}
        assert plan["state"] == longest and plan["where"] >= 12, (width, plan)
    assert [c.key for c in plan_columns(160, 4, False, with_gpu=False)] == [
        "rank", "state", "phase", "op", "where", "cpu", "rss", "pid"]


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (160, 40)])
async def test_a_stuck_time_past_a_minute_is_shown_whole(size):
    snap = straggler()
    snap = replace(snap, ranks=tuple(replace(r, stuck_for_s=754.0) if r.state == "stuck" else r for r in snap.ranks))
    app, _ = make_app(snap)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.polls == 1)
        screen = screen_text(app)
        assert "stuck ≥12m…" not in screen, screen
        rows = [line for line in screen.splitlines() if line.startswith(("  0 ", "  1 ", "  2 ", " ▶3 "))]
        assert len(rows) == 4 and all(" stuck ≥12m34s " in row for row in rows), screen


@pytest.mark.parametrize("width", [80, 100, 110, 120, 140])
async def test_no_heading_is_cut_at_the_right_edge(width):
    app, _ = make_app(healthy())
    async with app.run_test(size=(width, 30)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        words = header_line(app).replace("GPU mem", "GPU_mem").split()
        assert {w.replace("GPU_mem", "GPU mem") for w in words} <= HEADINGS, words  # no "GP", no "n/"
        rows = [line.rstrip() for line in screen_text(app).splitlines() if "    running " in line]
        assert len(rows) == 4
        for row in rows:  # each row ends on a whole value: no "n/", "30.0G/8", "50" of a pid
            assert row.endswith(("compute_step", "█", "▇", "30.0G/80.0G", "512M", "5000", "5001", "5002", "5003")), row


async def test_resizing_changes_the_columns_without_losing_rows_or_selection():
    app, _ = make_app(straggler())
    async with app.run_test(size=(80, 30)) as pilot:
        table = app.query_one(RanksTable)
        await until(pilot, lambda: app.polls == 1)
        await pilot.press("k")
        assert "CPU%" not in header_line(app)
        await pilot.resize_terminal(130, 30)
        await pilot.pause(0.2)
        # no rank has a GPU reading: no column of n/a takes the room
        assert "CPU%" in header_line(app) and "GPU%" not in header_line(app)
        assert table.row_count == 4 and table.selected_key == "node1:2"
        assert "  3% " in screen_text(app)  # the new column is filled, not blank
        await pilot.resize_terminal(80, 30)
        await pilot.pause(0.2)
        assert "CPU%" not in header_line(app) and table.selected_key == "node1:2"


async def test_rank_column_stays_when_a_narrow_table_scrolls_sideways():
    app, _ = make_app(straggler())
    async with app.run_test(size=(44, 30)) as pilot:
        table = app.query_one(RanksTable)
        await until(pilot, lambda: app.polls == 1)
        table.scroll_to(x=table.max_scroll_x, animate=False)
        await pilot.pause(0.2)
        assert table.scroll_x > 10  # past the whole rank column
        assert header_line(app).split()[0] == "rank"
        assert "▶3" in screen_text(app)


async def test_step_is_a_column_where_it_fits_and_always_in_the_detail():
    app, _ = make_app(gpu_wait())
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        text = screen_text(app)
        assert "step " not in header_line(app)
        assert "step 1199" in text and "(0.43s/step)" in text  # rank 1, the culprit, is selected
    app, _ = make_app(gpu_wait())
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        assert " step " in header_line(app)
        assert any(line.split()[:1] == ["0"] and "1200" in line for line in screen_text(app).splitlines())


async def test_gpu_wait_and_exiting_are_styled():
    app, _ = make_app(gpu_wait())
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        table = app.query_one(RanksTable)
        assert table.get_cell("node1:1", "phase").style == lines.WAITING_STYLE
        assert table.get_cell("node1:1", "phase").plain == "gpu_wait"
        assert table.get_cell("node1:0", "phase").style == lines.WAITING_STYLE  # collective: waiting too
    assert lines.phase_style("exiting") == "dim" and lines.phase_style("compute") == "green"
    assert lines.phase_style("dataloader") == lines.WAITING_STYLE


def test_one_renderer_for_state_verdict_and_groups():
    from rich.console import Console

    from trainwatch.tui.render import render_table

    snap = straggler()
    console = Console(width=140, record=True, color_system=None)
    console.print(render_table(snap))
    text = console.export_text()
    assert lines.verdict_line(snap).plain in text  # the same words as the live header, without "for …"
    assert lines.group_line(snap.groups[1], True).plain.strip() in text
    assert lines.state_label(snap.ranks[3]) == "stuck ≥42s" and "stuck ≥42s" in text
    crashed_rank = replace(snap.ranks[3], exit=replace(snap.ranks[3], rank=3).exit)
    assert lines.state_label(crashed_rank) == "stuck ≥42s"  # no exit: still its state


def test_unreadable_values_are_n_a():
    from trainwatch.tui.widgets.detail import facts_text
    from trainwatch.tui.widgets.ranks import row_cells
    from trainwatch.tui.widgets.history import History

    rank = replace(healthy().ranks[0], cpu_pct=None, rss_bytes=None, gpu=None, pid=None)
    cells = row_cells(rank, False, History())
    assert cells["rss"].plain == cells["gpu"].plain == cells["gmem"].plain == cells["pid"].plain == "n/a"
    assert cells["cpu"].plain.strip() == "n/a"
    assert "CPU n/a · RSS n/a" in facts_text(rank).plain


async def test_a_tall_rank_s_detail_opens_at_its_first_line():
    """At 80x24 the detail pane holds 8 lines; a culprit whose text puts its marked frame far below
    them opens at its own heading, not part-scrolled into a sentence."""
    base = straggler()
    tall = replace(base.ranks[3], stuck_source="asleep in nanosleep() for 42 s, since before trainwatch first "
                   "looked (the scheduler's clock)", waits_for="a child process it started: PID 812 `sleep 3600` "
                   "(running 41 s), blocked in wait4()",
                   detail="main thread sleeps in the user's code; " * 6)
    app, _ = make_app(replace(base, ranks=(*base.ranks[:3], tall)))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        await pilot.pause(0.2)
        rows = screen_text(app).splitlines()
        first = rows[next(i for i, line in enumerate(rows) if line.lstrip("━─").startswith("detail")) + 1]
        assert first.strip().startswith("rank 3 · pid 5003"), "\n".join(rows)
