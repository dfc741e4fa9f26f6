"""Source errors, the last evidence dump and the snapshot's warnings, shown in full under the header."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from . import format as fmt


class AlertBar(Static):
    """One line per error, dump status or warning; hidden when there is nothing to say."""

    DEFAULT_CSS = """
    AlertBar { height: auto; max-height: 4; display: none; }
    AlertBar.-shown { display: block; }
    """

    def show(self, warnings: tuple[str, ...], error: str | None, status: Text | None = None) -> None:
        """``status``: what the last ``d`` did (writing, the bundle's path, or why it failed)."""
        lines: list[Text] = []
        if error:
            lines.append(Text.assemble(("✖ ", "bold red"), (error, "red")))
        if status is not None:
            lines.append(status)
        for warning in warnings:
            lines.append(Text.assemble(("⚠ ", "bold yellow"), (warning, "yellow")))
        text = Text("\n").join(lines)
        self.set_class(bool(lines), "-shown")
        fmt.update_if_changed(self, text)
