"""Warnings from the snapshot and source errors, shown in full under the header."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from . import format as fmt


class AlertBar(Static):
    """One line per warning or error; hidden when there is nothing to say."""

    DEFAULT_CSS = """
    AlertBar { height: auto; max-height: 4; display: none; }
    AlertBar.-shown { display: block; }
    """

    def show(self, warnings: tuple[str, ...], error: str | None) -> None:
        text = Text()
        if error:
            text.append("✖ ", style="bold red")
            text.append(error, style="red")
        for warning in warnings:
            if text:
                text.append("\n")
            text.append("⚠ ", style="bold yellow")
            text.append(warning, style="yellow")
        self.set_class(bool(text), "-shown")
        fmt.update_if_changed(self, text)
