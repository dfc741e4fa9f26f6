"""The words for values every view shows: one formatter per concept, for the live screens, the
plain ``snapshot`` table and ``summary.md`` alike (an unreadable value is always ``n/a``)."""

from __future__ import annotations

from .snapshot import ExitInfo

NA = "n/a"


def na(value: object | None) -> str:
    """``value`` as text, or ``n/a`` when it is unknown (None or empty)."""
    return NA if value is None or value == "" else str(value)


def how_ended(info: ExitInfo, alive: bool = False, short: bool = False) -> str:
    """How a rank ended. Long (sentences): ``killed by SIGSEGV``, ``exit code 1``, ``exit status
    not seen``; short (a table cell): ``SIGSEGV``, ``exit 1``, ``exited``. ``alive``: it raised an
    uncaught exception but a non-daemon thread keeps the process (``raised``)."""
    if alive:
        return "raised" if short else "raised an uncaught exception; the process is still alive"
    if info.signal:
        return info.signal if short else f"killed by {info.signal}"
    if info.code is not None:
        return f"exit {info.code}" if short else f"exit code {info.code}"
    return "exited" if short else "exit status not seen"
