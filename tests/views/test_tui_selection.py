"""Which rank the live view shows: the culprit first, then whatever the user picks, kept."""

from __future__ import annotations

from dataclasses import replace

from trainwatch.probes.snapshot import Group, Verdict
from trainwatch.tui.widgets.ranks import RanksTable

from test_tui_app import make_app, row_keys, screen_text, until
from tui_samples import NOW, healthy, straggler


def detail_head(app) -> str:
    """The first line of the detail pane as on screen, e.g. ``rank 3 · pid 5003 · …``."""
    line = next(line for line in screen_text(app).splitlines() if " · pid " in line)
    return line.split("│")[-1].strip()  # side by side with the groups pane at 110+ columns


def straggler_at(culprit: int):
    """The straggler sample with rank ``culprit`` as the one the others wait for."""
    snap = straggler()
    return replace(snap, verdict=replace(snap.verdict, culprits=(culprit,)))


async def test_opens_on_the_culprit_with_its_where_and_own_frame():
    app, _ = make_app(straggler())
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        assert app.query_one(RanksTable).selected_key == "node1:3"
        text = screen_text(app)
        assert detail_head(app).startswith("rank 3 · pid 5003")
        assert "where: train.py:108 train" in text
        assert "▶ train.py:108 train" in text  # its frame in the user's code, without scrolling


async def test_follows_a_new_culprit_until_the_user_moves_then_keeps_their_choice():
    app, _ = make_app(straggler(), straggler_at(1), straggler_at(1), straggler_at(2))
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.query_one(RanksTable)
        await until(pilot, lambda: app.polls == 1)
        assert table.selected_key == "node1:3"
        await pilot.press("s")
        await until(pilot, lambda: app.polls == 2)
        assert table.selected_key == "node1:1"  # nobody chose yet: the new culprit
        await pilot.press("j")
        assert table.selected_key == "node1:2"
        assert detail_head(app).startswith("rank 2 ")
        await pilot.press("s")
        await until(pilot, lambda: app.polls == 3)
        assert table.selected_key == "node1:2"
        await pilot.press("k")  # the user's choice may be a culprit too
        await pilot.press("s")
        await until(pilot, lambda: app.polls == 4)  # the culprit is now rank 2: the view stays on 1
        assert table.selected_key == "node1:1"
        assert detail_head(app).startswith("rank 1 ")


async def test_selection_and_native_toggle_survive_a_filter_and_its_clearing():
    app, source = make_app(straggler())
    async with app.run_test(size=(100, 40)) as pilot:
        table = app.query_one(RanksTable)
        await until(pilot, lambda: app.polls == 1)
        await pilot.press("k", "k")  # rank 1
        await pilot.press("n")
        assert "native stacks on" in detail_head(app)
        await pilot.press("slash", *"0,2-3")  # rank 1 filtered out
        assert row_keys(app) == ["node1:0", "node1:2", "node1:3"]
        await pilot.press("escape")
        assert row_keys(app) == ["node1:0", "node1:1", "node1:2", "node1:3"]
        assert table.selected_key == "node1:1"
        assert detail_head(app) == "rank 1 · pid 5001 · host node1 · local 1 · native stacks on"
        await pilot.press("s")
        await until(pilot, lambda: app.polls == 2)
        assert source.calls[-1] == frozenset({1})


async def test_moving_inside_a_filter_is_kept_after_clearing():
    app, _ = make_app(straggler())
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.query_one(RanksTable)
        await until(pilot, lambda: app.polls == 1)
        await pilot.press("slash", *"all_reduce", "enter")
        await pilot.press("j")
        chosen = table.selected_key
        assert chosen in ("node1:0", "node1:1", "node1:2")
        await pilot.press("escape")
        assert len(row_keys(app)) == 4 and table.selected_key == chosen


def three_groups():
    snap = straggler()
    groups = (Group(ranks=(0, 1), phase="collective", op="all_reduce", where="train.py:44 sync_gradients",
                    label="0-1"),
              Group(ranks=(2,), phase="dataloader", where="train.py:60 next_batch", label="2"),
              Group(ranks=(3,), phase="sleep", where="train.py:108 train", label="3", culprit=True))
    return replace(snap, groups=groups, verdict=Verdict("straggler", culprits=(3,), since=NOW - 42,
                                                        summary="rank 3 sleeps"))


async def test_groups_pane_j_k_pick_a_group_and_select_its_first_rank():
    app, _ = make_app(three_groups())
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.query_one(RanksTable)
        await until(pilot, lambda: app.polls == 1)
        await pilot.press("enter")  # focus: ranks -> groups
        assert app.focused.id == "groups"
        assert app.query_one("#groups").cursor == 2  # on the selected rank's (the culprit's) group
        await pilot.press("k")
        assert table.selected_key == "node1:2"
        assert detail_head(app).startswith("rank 2 ")
        await pilot.press("k")
        assert table.selected_key == "node1:0"  # the first rank of ranks 0-1
        await pilot.press("k")  # already on the first group
        assert table.selected_key == "node1:0"
        await pilot.press("j", "j")
        assert table.selected_key == "node1:3"
        await pilot.press("k", "s")
        await until(pilot, lambda: app.polls == 2)
        assert table.selected_key == "node1:2"  # a group pick is the user's choice: kept over the culprit


async def test_groups_pane_cursor_is_drawn_only_while_focused():
    app, _ = make_app(three_groups())
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        body = app.query_one("#groups-body")
        assert not any("reverse" in str(span.style) for span in body.content.spans)
        await pilot.press("enter")
        await pilot.pause()
        assert any("reverse" in str(span.style) for span in body.content.spans)


async def test_healthy_job_opens_on_the_first_rank():
    app, _ = make_app(healthy())
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        assert app.query_one(RanksTable).selected_key == "node1:0"
