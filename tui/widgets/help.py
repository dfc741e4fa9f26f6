"""The ``?`` overlay: every key and what it does."""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("↑ ↓  j k", "select a rank (groups pane: a group)"),
    ("PgUp PgDn Home End", "a page up / down; the first / last"),
    ("← →", "scroll the ranks table sideways"),
    ("Enter Tab Shift+Tab", "next / previous pane"),
    ("n", "native (C/C++) stacks of the selected rank"),
    ("s", "sample now"),
    ("p", "pause / resume sampling"),
    ("+  -", "longer / shorter refresh interval"),
    ("/", "filter: ranks (0-3,7) or words (stuck)"),
    ("Esc", "clear the filter"),
    ("d", "dump evidence into {dump_dir}"),
    ("?", "this help"),
    ("q  Ctrl+C  Ctrl+Q", "{quit}"),
    ("Ctrl+Z", "suspend to the shell (fg resumes)"),
)
LIVE_ONLY = {"n", "s", "p", "+  -", "d"}


class HelpScreen(ModalScreen[None]):
    """A modal list of keys; any of Esc, ? or q closes it (Ctrl+C still quits the app)."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Static {
        width: auto; max-width: 90%; height: auto; max-height: 90%;
        border: round $accent; padding: 0 1; background: $panel;
    }
    """
    BINDINGS = [
        Binding("escape,question_mark,q", "close", "close", show=False),
    ]

    def __init__(self, live: bool = True, quit_help: str = "quit", dump_dir: str = "the current directory") -> None:
        """``quit_help``: what ``q`` does here (the job keeps running, or the demo job stops);
        ``dump_dir``: where ``d`` writes, as shown to the user."""
        super().__init__()
        self.live = live
        self.quit_help = quit_help
        self.dump_dir = dump_dir

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for key, what in KEYS:
            if self.live or key not in LIVE_ONLY:
                table.add_row(key, what.format(quit=self.quit_help, dump_dir=self.dump_dir))
        box = Static(table)
        box.border_title = "trainwatch keys"
        box.border_subtitle = "Esc closes"
        yield box

    def action_close(self) -> None:
        self.dismiss(None)
