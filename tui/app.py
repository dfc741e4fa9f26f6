"""The live monitor: a Textual app fed by a :class:`~trainwatch.probes.source.Source`.

Polls run one at a time in a thread worker; the next one is armed only when the previous
one has been handled, so a slow or stuck probe never piles up work or freezes the screen.
Each finished poll arrives as one frozen snapshot in a message; widgets redraw from it inside
one ``batch_update``. The source belongs to whoever opened it, who also closes it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Container
from textual.message import Message
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Input
from textual.worker import get_current_worker

from ..probes import (
    PROBLEM_VERDICTS, Rank, Snapshot, Source, TrainwatchError, write_evidence,
)

from . import hangup
from .widgets import format as fmt
from .widgets.alerts import AlertBar
from .widgets.detail import DetailPane
from .widgets.groups import GroupsPane
from .widgets.header import JobHeader
from .widgets.help import HelpScreen
from .widgets.history import History
from .widgets.rankfilter import matches
from .widgets.ranks import RanksTable

INTERVALS = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0)
LIVE_ACTIONS = {"native", "sample", "pause", "slower", "faster", "dump"}


class SnapshotReady(Message):
    """A poll finished: the frozen snapshot (everything the views draw, log tails included)."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class PollFailed(Message):
    """A poll raised; ``error`` is the line to show."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


def native_id(rank: Rank) -> int | None:
    """What ``native_for`` holds for a rank: its global rank number (unique across nodes)."""
    return rank.rank


def culprit_key(snapshot: Snapshot | None, ranks: list[Rank]) -> str | None:
    """The row key of the verdict's first culprit among ``ranks`` (None without one)."""
    if snapshot is None:
        return None
    for number in snapshot.verdict.culprits:
        for rank in ranks:
            if rank.rank == number:
                return rank.key
    return None


MIN_PAUSE_S = 0.2  # between the end of a poll that took longer than the interval and the next


class TrainwatchApp(App[None]):
    """Ranks table, stack groups and the selected rank's detail, refreshed from ``source``."""

    CSS_PATH = Path(__file__).with_name("trainwatch.tcss")  # absolute: subclasses live elsewhere
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "quit"),
        # As in htop, k9s or nvitop: Ctrl-C quits (Textual's own would only say "press ctrl+q").
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
        Binding("question_mark", "help", "help"),
        Binding("slash", "filter", "filter"),
        Binding("n", "native", "native", show=False),  # n, + and -: in the help screen (?)
        Binding("s", "sample", "sample"),
        Binding("p", "pause", "pause"),
        Binding("plus", "slower", "slower", key_display="+", show=False),
        Binding("minus", "faster", "faster", key_display="-", show=False),
        Binding("d", "dump", "dump"),
        Binding("j", "move(1)", "down", show=False),
        Binding("k", "move(-1)", "up", show=False),
        Binding("enter", "next_pane", "next pane", show=False),
        Binding("escape", "clear_filter", "clear filter", show=False),
        Binding("ctrl+z", "suspend_process", "suspend", show=False),
    ]

    QUIT_HELP = "quit; the job keeps running (trainwatch only reads it)"

    def __init__(self, source: Source, interval: float = 2.0, title: str = "trainwatch",
                 live: bool = True, clock: Callable[[], float] = time.time,
                 dump_dir: Path | None = None, quit_help: str | None = None) -> None:
        """``dump_dir``: where ``d`` writes bundles (default: the current directory).
        ``quit_help``: what ``q`` does, for the help screen."""
        super().__init__()
        self.source = source
        self.interval = interval
        self.title = title
        self.live = live
        self.clock = clock
        self.dump_dir = dump_dir
        self.quit_help = quit_help or (self.QUIT_HELP if live else "quit")
        self.dumps: list[Path] = []  # bundles written by `d`, printed when the app ends
        self.dump_status: Text | None = None  # the alerts line about the last `d`
        self.snapshot: Snapshot | None = None
        self.history = History()
        self.native_for: set[int] = set()
        self.paused = False
        self._paused_at: float | None = None  # the clock when sampling was paused: durations stop there
        self.filter_text = ""
        self.error: str | None = None
        self.polls = 0
        self._polling_since: float | None = None  # monotonic start of the poll in flight
        self._timer: Timer | None = None
        self._clock_timer: Timer | None = None  # redraws durations (uptime, "for 12s") every second
        self._alerted: str | None = None  # problem verdict already announced
        self._detail_key: str | None = None  # the rank the detail pane shows

    # ----- layout

    def compose(self) -> ComposeResult:
        yield JobHeader(id="header")
        yield AlertBar(id="alerts")
        yield RanksTable(id="ranks")
        with Container(id="lower"):
            yield GroupsPane(id="groups")
            yield DetailPane(id="detail")
        yield Input(placeholder="filter: ranks 0-3,7 or words like stuck, dataloader", id="filter")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#ranks").border_title = "ranks"
        self.query_one("#groups").border_title = "stack groups"
        self.query_one("#detail").border_title = "detail"
        self.query_one("#filter").display = False
        self.query_one(RanksTable).focus()
        self._redraw()
        self._clock_timer = self.set_interval(1.0, self._tick)
        self._hangup = hangup.quit_loop_on_hangup(self.exit)  # the terminal went: quit as `q` does
        self._begin_poll()

    def _torn_down(self) -> bool:
        """Whether the app is shutting down (or has): its screen's widgets may be gone already, while
        messages, timers and worker callbacks still arrive (a poll that finished as the app quit, the
        row highlight of the last redraw). Every handler of those first asks this, and then does nothing."""
        return not self.is_running  # Textual clears it as soon as it starts tearing the app down

    # ----- polling

    def _begin_poll(self) -> None:
        """Start a poll unless one is in flight; the next is armed when this one is handled."""
        if self._polling_since is not None or self._torn_down():
            return
        self._cancel_timer()
        self._polling_since = time.monotonic()
        self._poll(frozenset(self.native_for))
        self._tick()

    @work(thread=True, group="poll", exit_on_error=False)
    def _poll(self, native_for: frozenset[int]) -> None:
        # The probe runs in a daemon thread of its own: if it hangs, quitting still works,
        # because the worker gives up waiting on cancel and nobody joins the daemon.
        worker = get_current_worker()
        result: list[Message] = []
        done = threading.Event()

        def probe() -> None:
            try:
                snapshot = self.source.poll(native_for=native_for)
                result.append(SnapshotReady(snapshot))
            except TrainwatchError as exc:
                result.append(PollFailed(exc.message + (f" ({exc.remedy})" if exc.remedy else "")))
            except Exception as exc:  # noqa: BLE001 - a probe bug must not take the monitor down
                result.append(PollFailed(f"sampling failed: {type(exc).__name__}: {exc}"))
            finally:
                done.set()

        threading.Thread(target=probe, name="trainwatch-poll", daemon=True).start()
        while not done.wait(0.2):
            if worker.is_cancelled:
                return
        if not worker.is_cancelled:
            self.post_message(result[0])

    def _arm_next(self) -> None:
        # "every 2s" is from one poll's start to the next: a poll that took 0.5 s does not push every
        # later one (and the first sight of a hang) half a second further out.
        started, self._polling_since = self._polling_since, None
        if self.live and not self.paused and not self._torn_down():
            self._cancel_timer()
            took = time.monotonic() - started if started is not None else 0.0
            self._timer = self.set_timer(max(MIN_PAUSE_S, self.interval - took), self._begin_poll)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        if self._torn_down():  # a poll that finished while quitting
            return
        self.polls += 1
        self.snapshot = message.snapshot
        self.history.record(message.snapshot)
        self.error = None
        self._redraw()
        self._announce(message.snapshot)
        self._arm_next()

    def on_poll_failed(self, message: PollFailed) -> None:
        if self._torn_down():
            return
        self.polls += 1
        self.error = message.error
        self._redraw()
        self._arm_next()

    def _announce(self, snapshot: Snapshot) -> None:
        """One bell and one notification when the verdict turns into a (different) problem."""
        kind = snapshot.verdict.kind
        if kind not in PROBLEM_VERDICTS:
            self._alerted = None
            return
        if kind == self._alerted:
            return
        self._alerted = kind
        self.bell()  # no toast: it would cover the detail pane, and the header shows the verdict in full

    # ----- drawing

    def visible_ranks(self) -> list[Rank]:
        ranks = self.snapshot.ranks if self.snapshot else ()
        return [r for r in ranks if matches(r, self.filter_text)]

    def selected_rank(self) -> Rank | None:
        key = self.query_one(RanksTable).selected_key
        if self.snapshot is None or key is None:
            return None
        return next((r for r in self.snapshot.ranks if r.key == key), None)

    def job_ended(self) -> bool:
        return bool(self.snapshot and self.snapshot.ranks and all(r.exit for r in self.snapshot.ranks))

    def status_text(self) -> Text:
        parts: list[tuple[str, str]] = []
        if self.filter_text:
            parts.append((f"filter: {self.filter_text}", "bold cyan"))
        if self.job_ended():
            parts.append(("job ended", "bold red"))
        if not self.live:
            parts.append(("read-only", "bold"))
            if self.snapshot is not None and self.snapshot.taken_at:
                parts.append((f"dumped {fmt.duration(self.clock() - self.snapshot.taken_at)} ago", "dim"))
        elif self.paused:
            parts.append(("paused", "bold yellow reverse"))
        else:
            busy = time.monotonic() - self._polling_since if self._polling_since is not None else 0.0
            window = self.snapshot.window_s if self.snapshot else 0.0
            if busy > window + 5:
                parts.append((f"sampling for {busy:.0f}s…", "bold yellow"))
            parts.append((f"every {self.interval:g}s", "dim"))
        text = Text()
        for i, (part, style) in enumerate(parts):
            text.append(" · " if i else "", style="dim")
            text.append(part, style=style)
        return text

    def durations_now(self) -> float:
        """The time durations ("up", "for 42s") are measured to: a bundle's are as at its dump; a
        job that ended, as when it ended; while paused, as when sampling was paused; else now."""
        snapshot = self.snapshot
        if not self.live and snapshot is not None and snapshot.taken_at:
            return snapshot.taken_at
        if self.job_ended():
            ended = [r.exit.at for r in snapshot.ranks if r.exit is not None and r.exit.at]
            return max(ended) if ended else snapshot.taken_at or self.clock()
        if self.paused and self._paused_at is not None:
            return self._paused_at
        return self.clock()

    def _redraw(self) -> None:
        with self.batch_update():
            now = self.durations_now()
            snapshot = self.snapshot
            self.query_one(JobHeader).show(snapshot, now, self.status_text())
            self.query_one(AlertBar).show(snapshot.warnings if snapshot else (), self.error, self.dump_status)
            culprits = frozenset(snapshot.verdict.culprits) if snapshot else frozenset()
            table = self.query_one(RanksTable)
            ranks = self.visible_ranks()
            table.show(ranks, culprits, self.history, default=culprit_key(snapshot, ranks))
            table.border_title = self._ranks_title(snapshot, ranks)
            self.query_one(GroupsPane).show(snapshot)
            self._redraw_detail()

    def _ranks_title(self, snapshot: Snapshot | None, shown: list[Rank]) -> str:
        if not self.filter_text:
            return "ranks"
        if snapshot is not None and snapshot.ranks and not shown:
            return f"ranks · filter: {self.filter_text} · no rank matches (Esc clears)"
        return f"ranks · filter: {self.filter_text}"

    def _redraw_detail(self) -> None:
        rank = self.selected_rank()
        native = rank is not None and native_id(rank) in self.native_for
        key = rank.key if rank else None
        fresh, self._detail_key = key != self._detail_key, key
        # "exited 2m ago" is the age of an event: it keeps counting (a bundle's, as at its dump)
        ages_to = self.snapshot.taken_at if not self.live and self.snapshot and self.snapshot.taken_at else self.clock()
        self.query_one(DetailPane).show(rank, ages_to, native, fresh=fresh)
        if fresh and rank is not None and rank.rank is not None:
            self.query_one(GroupsPane).follow(rank.rank)
            self.source.select(frozenset({rank.rank}))  # other nodes send every thread of it from now on

    def _tick(self) -> None:
        if self._torn_down():  # the timer can still fire while the screen is being torn down
            return
        self.query_one(JobHeader).show(self.snapshot, self.durations_now(), self.status_text(), layout=False)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self._torn_down():  # the last redraw's highlight reaches the app after the table is gone
            return
        self._redraw_detail()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if self._torn_down():
            return
        self.action_next_pane()

    # ----- keys

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in LIVE_ACTIONS and not self.live:
            return False
        return True

    def action_move(self, delta: int) -> None:
        table = self.query_one(RanksTable)
        if delta > 0:
            table.action_cursor_down()
        else:
            table.action_cursor_up()

    def on_groups_pane_picked(self, message: GroupsPane.Picked) -> None:
        """A group picked in the groups pane selects its first rank (the filter permitting)."""
        if self._torn_down():
            return
        wanted = set(message.group.ranks)
        rank = next((r for r in self.visible_ranks() if r.rank in wanted), None)
        if rank is None:
            self.notify(f"the filter hides ranks {message.group.label}; Esc clears it", timeout=3)
            return
        self.query_one(RanksTable).choose(rank.key)

    def action_next_pane(self) -> None:
        self.screen.focus_next()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(live=self.live, quit_help=self.quit_help,
                                    dump_dir=fmt.display_path(self.dump_dir or Path.cwd())))

    def action_sample(self) -> None:
        if self._polling_since is not None:
            self.notify("a sample is already being taken", timeout=3)
            return
        self._begin_poll()

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._paused_at = self.clock() if self.paused else None
        if self.paused:
            self._cancel_timer()
            self.notify("sampling paused; p resumes", timeout=3)
        else:
            self._begin_poll()
        self._redraw()  # durations stop (or run again) in every pane

    def _set_interval(self, step: int) -> None:
        steps = [i for i in INTERVALS if (i > self.interval if step > 0 else i < self.interval)]
        if not steps:
            return
        self.interval = steps[0] if step > 0 else steps[-1]
        if self._timer is not None:  # re-arm the waiting timer with the new interval
            self._arm_next()
        self.notify(f"sampling every {self.interval:g}s", timeout=2)
        self._tick()

    def action_slower(self) -> None:
        self._set_interval(+1)

    def action_faster(self) -> None:
        self._set_interval(-1)

    def action_native(self) -> None:
        rank = self.selected_rank()
        ident = native_id(rank) if rank else None
        if ident is None:
            self.notify("select a running rank first", severity="warning", timeout=3)
            return
        if ident in self.native_for:
            self.native_for.discard(ident)
            self.notify(f"native stacks off for rank {rank.rank}", timeout=3)
        else:
            self.native_for.add(ident)
            self.notify(f"native stacks for rank {rank.rank} from the next sample", timeout=3)
        self._redraw_detail()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.value = self.filter_text
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = False
        if self.filter_text:
            self.filter_text = ""
            self._redraw()
        self.query_one(RanksTable).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if self._torn_down():
            return
        self.filter_text = event.value.strip()
        self._redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if self._torn_down():
            return
        event.input.display = False
        self.query_one(RanksTable).focus()

    def action_dump(self) -> None:
        if self.snapshot is None:
            self.notify("nothing sampled yet", severity="warning", timeout=3)
            return
        out = self.dump_dir or Path.cwd()  # write_bundle names its own trainwatch-<host>-<pid>-<time> folder
        self._set_dump_status(Text.assemble(("… ", "bold"), f"writing evidence into {fmt.display_path(out)}"))
        self._dump(self.snapshot, out)

    def _set_dump_status(self, status: Text) -> None:
        self.dump_status = status
        if self._torn_down():  # a dump that ended as the app quit: its path is still printed at the end
            return
        self.query_one(AlertBar).show(self.snapshot.warnings if self.snapshot else (), self.error, status)

    def _dumped(self, path: Path) -> None:
        self.dumps.append(path)
        room = self.size.width - len("✔ evidence: ") - 2  # the alerts' padding
        shown = fmt.fit_path(path, room)
        self._set_dump_status(Text.assemble(("✔ ", "bold green"), "evidence: ", (shown, "bold")))

    def _dump_failed(self, why: str) -> None:
        self._set_dump_status(Text.assemble(("✖ ", "bold red"), (f"dump failed: {why}", "red")))

    @work(thread=True, group="dump", exclusive=True, exit_on_error=False)
    def _dump(self, snapshot: Snapshot, out: Path) -> None:
        try:
            path = write_evidence(self.source, snapshot, out)  # the dump's py-spy is not progress
        except TrainwatchError as exc:
            self.call_from_thread(self._dump_failed, exc.message)
        except OSError as exc:
            self.call_from_thread(self._dump_failed, f"{exc.strerror or exc}: {exc.filename or ''}")
        else:
            self.call_from_thread(self._dumped, Path(os.path.abspath(path)))

    # ----- shutdown

    def on_unmount(self) -> None:
        # The source belongs to whoever opened it (and closes it); quitting only stops polling.
        if getattr(self, "_hangup", False):
            hangup.leave_loop()
        self._cancel_timer()
        if self._clock_timer is not None:
            self._clock_timer.stop()
        self.workers.cancel_group(self, "poll")
