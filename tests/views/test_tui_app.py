"""Pilot tests of the live monitor: snapshots go in at the source boundary, the screen is read back."""

from __future__ import annotations

import asyncio
import io
import re
import threading
from dataclasses import replace

from rich.console import Console

from trainwatch.probes.errors import NoSuchProcess
from trainwatch.probes.snapshot import ExitInfo
from trainwatch.probes.read.logs.ranklog import RankLogs
from trainwatch.tui.app import TrainwatchApp
from trainwatch.tui.widgets.help import HelpScreen
from trainwatch.tui.widgets.ranks import RanksTable

from tui_samples import ListSource, clock, crashed, healthy, straggler


def screen_text(app: TrainwatchApp) -> str:
    """The characters on the terminal right now, as the user sees them."""
    width, _ = app.size
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None, force_terminal=True)
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()


async def until(pilot, condition, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if condition():
            await pilot.pause()
            return
        await pilot.pause(0.05)
    raise AssertionError("condition not met in time")


def make_app(*snapshots, **kwargs) -> tuple[TrainwatchApp, ListSource]:
    source = ListSource(*snapshots)
    kwargs.setdefault("interval", 60.0)  # tests sample with `s` unless they say otherwise
    return TrainwatchApp(source, clock=clock, **kwargs), source


def row_keys(app: TrainwatchApp) -> list[str]:
    table = app.query_one(RanksTable)
    return [table.coordinate_to_cell_key((i, 0)).row_key.value for i in range(table.row_count)]


async def test_straggler_screen_shows_verdict_culprit_and_groups():
    app, _ = make_app(straggler())
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        text = screen_text(app)
        assert "STRAGGLER" in text and "for 42s" in text
        assert "rank 3 is in its own code" in text
        assert "▶3" in text  # culprit row marked
        assert "▶ rank 3: sleep ← train.py:108 train" in text
        assert "ranks 0-2: all_reduce ← train.py:44 sync_gradients" in text
        assert "⚠ ranks 0-2 have waited 42s in all_reduce" in text
        assert "note: GPU metrics: no NVIDIA driver" in text
        assert "up 12m34s" in text
        assert row_keys(app) == ["node1:0", "node1:1", "node1:2", "node1:3"]


async def test_rows_update_in_place_and_cursor_stays():
    second = straggler()
    second = replace(second, ranks=tuple(replace(r, stuck_for_s=99.0) for r in second.ranks))
    app, _ = make_app(straggler(), second)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        table = app.query_one(RanksTable)
        added = []
        original = table.add_row
        table.add_row = lambda *a, **k: added.append(k) or original(*a, **k)
        table.clear = lambda *a, **k: (_ for _ in ()).throw(AssertionError("table cleared"))
        await pilot.press("k")  # from the culprit (rank 3) up to rank 2
        assert table.selected_key == "node1:2"
        await pilot.press("s")
        await until(pilot, lambda: app.polls == 2)
        assert added == []
        assert table.selected_key == "node1:2"
        assert "1m39s" in screen_text(app)  # the stuck time of the new sample
        await pilot.press("k")
        assert table.selected_key == "node1:1"


async def test_detail_pane_shows_threads_user_frame_and_native_toggle():
    app, source = make_app(straggler())
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        text = screen_text(app)  # the culprit, rank 3, is selected from the start
        assert "rank 3 · pid 5003" in text
        assert "main thread sleeps in the user's code" in text
        assert "▶ train.py:108 train" in text  # the user's frame is marked
        assert "1 native frame hidden" in text
        assert "<built-in> sleep" not in text
        await pilot.press("n")
        assert "<built-in> sleep" in screen_text(app)
        await pilot.press("s")
        await until(pilot, lambda: app.polls == 2)
        assert source.calls[-1] == frozenset({3})  # the next poll asks for rank 3's native stacks
        await pilot.press("n", "s")
        await until(pilot, lambda: app.polls == 3)
        assert source.calls[-1] == frozenset()


async def test_filter_by_rank_list_and_words():
    app, _ = make_app(straggler())
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        await pilot.press("slash", "3")
        assert row_keys(app) == ["node1:3"]
        await pilot.press("enter")
        assert "filter: 3" in screen_text(app)
        await pilot.press("escape")
        assert len(row_keys(app)) == 4
        await pilot.press("slash", *"all_reduce", "enter")
        assert row_keys(app) == ["node1:0", "node1:1", "node1:2"]


async def test_pause_stops_polling_and_resume_restarts():
    app, source = make_app(healthy(), interval=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.polls >= 2)
        await pilot.press("p")
        assert "paused" in screen_text(app)
        count = len(source.calls)
        await pilot.pause(1.5)
        assert len(source.calls) == count
        await pilot.press("p")
        await until(pilot, lambda: len(source.calls) > count)
        assert "paused" not in screen_text(app)


async def test_interval_keys():
    app, _ = make_app(healthy(), interval=2.0)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        await pilot.press("plus")
        assert app.interval == 3.0
        assert "every 3s" in screen_text(app)
        await pilot.press("minus", "minus")
        assert app.interval == 1.0
        assert "every 1s" in screen_text(app)


# How the help names each key an app binding (or a widget's) reacts to.
KEY_NAMES = {"question_mark": "?", "slash": "/", "plus": "+", "minus": "-", "enter": "Enter", "escape": "Esc",
             "ctrl+z": "Ctrl+Z", "ctrl+c": "Ctrl+C", "ctrl+q": "Ctrl+Q", "tab": "Tab", "shift+tab": "Shift+Tab",
             "up": "↑", "down": "↓", "left": "←", "right": "→", "pageup": "PgUp", "pagedown": "PgDn",
             "home": "Home", "end": "End", "ctrl+home": "Home", "ctrl+end": "End"}


async def test_help_overlay_lists_every_key():
    """Every key that does something in the live view is in `?`: the app's bindings (Textual's own
    Ctrl+Q and Tab included) and the ranks table's."""
    from textual.app import App
    from textual.screen import Screen

    app, _ = make_app(healthy())
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        for words in ("select a rank", "native", "sample now", "pause", "filter", "dump evidence",
                      "quit", "suspend"):
            assert words in text
        bound = [b.key for b in (*App.BINDINGS, *TrainwatchApp.BINDINGS, *Screen.BINDINGS, *RanksTable.BINDINGS)
                 if b.action not in ("help_quit", "screen.copy_text")]  # Textual's, replaced by Ctrl+C's quit
        keys = {KEY_NAMES.get(key, key) for binding in bound for key in binding.split(",") if "super" not in key}
        missing = sorted(k for k in keys if not re.search(rf"(^|\s|│){re.escape(k)}(\s|$)", text, re.M))
        assert not missing, text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_ctrl_c_quits_as_q_does():
    """Ctrl+C quits at once (no "press ctrl+q" hint), from the main screen and from the help."""
    for keys in (("ctrl+c",), ("question_mark", "ctrl+c")):
        app, source = make_app(healthy())
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.polls == 1)
            await pilot.press(*keys)
            await pilot.pause()
            assert not app.is_running, keys
            assert not list(app._notifications), keys  # Textual's own Ctrl+C only says "press ctrl+q to quit"
        assert not source.closed  # the source belongs to whoever opened it


async def test_durations_stop_while_paused_and_once_the_job_ended():
    now = [clock()]
    app, _ = make_app(straggler())
    app.clock = lambda: now[0]
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        assert "for 42s" in screen_text(app) and "up 12m34s" in screen_text(app)
        await pilot.press("p")
        now[0] += 30
        app._tick()
        await pilot.pause()
        assert "for 42s" in screen_text(app) and "up 12m34s" in screen_text(app)
        await pilot.press("p")
        await until(pilot, lambda: app.polls == 2)
        assert "for 1m12s" in screen_text(app)

    ended = replace(straggler(), ranks=tuple(replace(r, state="exited", exit=ExitInfo(code=0, at=clock() - 4))
                                             for r in straggler().ranks))
    now = [clock()]
    app, _ = make_app(ended)
    app.clock = lambda: now[0]
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        before = screen_text(app)
        now[0] += 600
        app._tick()
        await pilot.pause()
        assert "job ended" in before and "up 12m30s" in before and "for 38s" in before  # as when it ended
        assert "up 12m30s" in screen_text(app) and "for 38s" in screen_text(app)


async def test_a_filter_that_matches_nothing_says_so():
    app, _ = make_app(straggler())
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        await pilot.press("slash", *"nothing-like-this", "enter")
        assert row_keys(app) == []
        assert "filter: nothing-like-this · no rank matches (Esc clears)" in screen_text(app)
        await pilot.press("escape")
        assert len(row_keys(app)) == 4 and "no rank matches" not in screen_text(app)


async def test_exited_rank_stays_with_signal_and_job_end_keeps_screen():
    dead_all = replace(crashed(), ranks=tuple(
        r if r.exit else replace(r, state="exited", exit=crashed().ranks[3].exit.__class__(code=1))
        for r in crashed().ranks))
    app, _ = make_app(straggler(), crashed(), dead_all)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        await pilot.press("s")
        await until(pilot, lambda: app.polls == 2)
        assert "node1:3" in row_keys(app)
        text = screen_text(app)
        assert "SIGSEGV" in text and "CRASHED" in text
        await pilot.press("j", "j", "j")
        assert "first rank to die" in screen_text(app)
        await pilot.press("s")
        await until(pilot, lambda: app.polls == 3)
        text = screen_text(app)
        assert "job ended" in text and "exit 1" in text and len(row_keys(app)) == 4


async def test_bell_once_per_problem():
    app, _ = make_app(straggler(), straggler(), straggler(), healthy(), straggler(), crashed())
    bells = []
    app.bell = lambda: bells.append(1)
    async with app.run_test(size=(80, 24)) as pilot:
        for n in range(1, 7):
            await until(pilot, lambda: app.polls == n)
            if n < 6:
                await pilot.press("s")
            if n == 3:
                assert len(bells) == 1
        assert len(bells) == 3  # straggler, straggler again after healthy, then crashed


async def test_source_error_is_one_clear_line():
    app, _ = make_app(NoSuchProcess("process 4242 is gone", remedy="is the job still running?"), interval=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.polls >= 3)
        text = screen_text(app)
        assert text.count("process 4242 is gone") == 1
        assert "Traceback" not in text
        assert app.is_running


async def test_error_then_recovery_clears_the_line():
    app, _ = make_app(NoSuchProcess("process 4242 is gone"), healthy())
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        assert "process 4242 is gone" in screen_text(app)
        await pilot.press("s")
        await until(pilot, lambda: app.polls == 2)
        assert "process 4242 is gone" not in screen_text(app)
        assert "HEALTHY" in screen_text(app)


async def test_read_only_mode_has_no_sampling_keys():
    app, source = make_app(healthy(), live=False, interval=0.5)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        await pilot.press("s", "p", "n")
        await pilot.pause(1.2)
        assert len(source.calls) == 1
        text = screen_text(app)
        assert "read-only" in text
        footer = text.rstrip("\n").splitlines()[-1]
        assert "quit" in footer and "sample" not in footer and "dump" not in footer


async def test_dump_writes_in_a_worker_with_judgement_paused_and_keeps_the_path_on_screen(monkeypatch, tmp_path):
    calls = []
    monkeypatch.chdir(tmp_path)
    bundle = tmp_path / "trainwatch-node1-4242-20231114T223000Z"

    def write_bundle(source_pid, snapshot, out_dir, **options):
        calls.append((source_pid, snapshot.verdict.kind, out_dir, threading.current_thread().name,
                      source.paused))
        return bundle

    monkeypatch.setattr("trainwatch.probes.evidence.bundle.write_bundle", write_bundle)
    app, source = make_app(straggler(), dump_dir=tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        await pilot.press("d")
        await until(pilot, lambda: app.dumps)
        await pilot.pause(0.3)
        text = screen_text(app)
        assert "✔ evidence: ./trainwatch-node1-4242-20231114T223000Z" in text  # one line, not a toast
        assert not app.query("Toast")
        await pilot.press("s")
        await until(pilot, lambda: app.polls == 2)
        assert "./trainwatch-node1-4242-20231114T223000Z" in screen_text(app)  # stays after the next sample
    (pid, kind, out, thread, paused) = calls[0]
    assert pid == 4242 and kind == "straggler" and out == tmp_path  # write_bundle names the folder
    assert thread != threading.main_thread().name
    assert paused  # the dump's py-spy attaches do not count as the ranks' progress
    assert app.dumps == [bundle]


async def test_a_long_dump_path_keeps_the_bundle_name_whole_on_one_line(monkeypatch, tmp_path):
    deep = tmp_path.joinpath(*["a-rather-long-folder-name"] * 4)
    bundle = deep / "trainwatch-node1-4242-20231114T223000Z"
    monkeypatch.setattr("trainwatch.probes.evidence.bundle.write_bundle", lambda *a, **k: bundle)
    app, _ = make_app(straggler(), dump_dir=deep)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        await pilot.press("d")
        await until(pilot, lambda: app.dumps)
        await pilot.pause(0.3)
        line = next(line for line in screen_text(app).splitlines() if "evidence:" in line)
        assert line.rstrip().endswith("a-rather-long-folder-name/trainwatch-node1-4242-20231114T223000Z")
        assert "✔ evidence: …" in line
    assert app.dumps == [bundle]


async def test_dump_failure_is_shown_where_the_path_would_be(monkeypatch, tmp_path):
    from trainwatch.probes.errors import OutputError

    def write_bundle(source_pid, snapshot, out_dir, **options):
        raise OutputError(f"cannot create the bundle in {out_dir}: No space left on device")

    monkeypatch.setattr("trainwatch.probes.evidence.bundle.write_bundle", write_bundle)
    app, _ = make_app(straggler(), dump_dir=tmp_path)
    async with app.run_test(size=(200, 40)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        await pilot.press("d")
        await until(pilot, lambda: "dump failed" in screen_text(app))
        assert "No space left on device" in screen_text(app)
        assert app.dumps == []


async def test_stuck_poll_does_not_freeze_the_screen_or_block_quit():
    release = threading.Event()

    class StuckSource(ListSource):
        def poll(self, native_for=frozenset()):
            if len(self.calls) >= 1:
                self.calls.append(native_for)
                release.wait(30)
            return super().poll(native_for)

    source = StuckSource(straggler())
    app = TrainwatchApp(source, clock=clock, interval=0.5)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.polls == 1)
            await until(pilot, lambda: len(source.calls) >= 2)  # the second poll hangs
            await pilot.press("plus", "j")
            assert app.interval == 1.0
            await pilot.press("s")  # no overlapping poll is started
            await pilot.pause(0.3)
            assert len(source.calls) == 2
            await asyncio.wait_for(pilot.press("q"), 5)
    finally:
        release.set()


async def test_log_tail_of_selected_rank(tmp_path):
    log = tmp_path / "rank.log"
    log.write_text("".join(f"step {i}\n" for i in range(200)))
    snap = straggler()
    logs = RankLogs()  # the tail as the live view reads it into the snapshot; the view only draws it
    snap = replace(snap, ranks=tuple(replace(r, log_path=str(log), log_tail=logs.shown_tail(str(log), r.rank, None))
                                     for r in snap.ranks))
    app, _ = make_app(snap)
    async with app.run_test(size=(120, 60)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        app.query_one("#detail").scroll_end(animate=False)
        await pilot.pause()
        text = screen_text(app)
        assert "step 199" in text and "step 150" not in text
    log.unlink()  # the view never reads the file: a merged view's log is on another node
    app, _ = make_app(snap)
    async with app.run_test(size=(120, 60)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        app.query_one("#detail").scroll_end(animate=False)
        await pilot.pause()
        assert "step 199" in screen_text(app)


async def test_enter_and_tab_move_focus_between_panes():
    app, _ = make_app(straggler())
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.polls == 1)
        assert app.focused.id == "ranks"
        await pilot.press("enter")
        assert app.focused.id == "groups"
        await pilot.press("tab")
        assert app.focused.id == "detail"
        await pilot.press("enter")
        assert app.focused.id == "ranks"


async def test_help_says_what_q_does_in_each_mode():
    import argparse

    from trainwatch.tui.commands.demo import demo_app

    def quit_line(app) -> str:  # the help box's row for q, e.g. "│ q   quit; the job keeps running … │"
        return next(line for line in screen_text(app).splitlines() if re.search(r"│\s*q\s{2,}\S", line))

    async def shown(app) -> tuple[str, str]:
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.polls == 1)
            footer = screen_text(app).rstrip("\n").splitlines()[-1]
            await pilot.press("question_mark")
            await pilot.pause()
            return quit_line(app), footer

    attach_help, attach_footer = await shown(make_app(healthy())[0])
    assert "quit; the job keeps running (trainwatch only reads it)" in attach_help
    open_help, _ = await shown(make_app(healthy(), live=False)[0])
    assert open_help.split("Ctrl+Q", 1)[1].strip().startswith("quit") and "job" not in open_help
    args = argparse.Namespace(interval=60.0, scenario="straggler")
    demo = demo_app(ListSource(healthy()), args)
    demo.clock = clock
    demo_help, demo_footer = await shown(demo)
    assert "quit and stop the demo job" in demo_help
    assert "quit+stop demo" in demo_footer and "quit+stop" not in attach_footer
