"""When the terminal goes (SIGHUP: an SSH session dropped, a tmux window killed), trainwatch stops as
`q` or Ctrl-C would: whatever it started stops with it (the demo job and its folder, py-spy runs,
node agents), and the job it watches is never touched.

Outside the live view SIGHUP raises :class:`Hangup` (a KeyboardInterrupt, so every ``finally`` and
cleanup that Ctrl-C runs, runs); inside it, the app's event loop hears it and quits. A SIGHUP that
was ignored when trainwatch started (``nohup``) stays ignored.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

EXIT_HANGUP = 128 + signal.SIGHUP
LAST_RESORT_S = 10.0  # the live view's shutdown can block writing to a terminal that is gone
_cleanups: list[Callable[[], object]] = []


def at_hangup(cleanup: Callable[[], object]) -> None:
    """``cleanup`` (stopping what this command started) runs even if the view's shutdown hangs."""
    _cleanups.append(cleanup)


def _last_resort() -> None:
    """If the process is still here ``LAST_RESORT_S`` after SIGHUP, run the cleanups and exit."""
    def run() -> None:
        time.sleep(LAST_RESORT_S)
        for cleanup in reversed(_cleanups):
            try:
                cleanup()
            except (OSError, RuntimeError, ValueError):
                pass  # best effort on the way out: the next cleanup still runs
        os._exit(EXIT_HANGUP)

    threading.Thread(target=run, name="tw-hangup-last-resort", daemon=True).start()


class Hangup(KeyboardInterrupt):
    """The terminal trainwatch ran in went away."""


def _raise(signum: int, frame: object) -> None:
    raise Hangup()


def install() -> None:
    """SIGHUP raises :class:`Hangup` from now on, unless it is ignored (``nohup``)."""
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _raise)


def quit_loop_on_hangup(quit_app: Callable[[], object]) -> bool:
    """Inside the live view's running event loop: SIGHUP calls ``quit_app`` there (the app exits
    as with `q`, and the command's cleanup follows). False where SIGHUP is ignored."""
    import asyncio  # the live view has it loaded; a one-shot command never needs it

    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        return False
    def hung_up() -> None:
        _last_resort()
        quit_app()

    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, hung_up)
    return True


def leave_loop() -> None:
    """The event loop is closing: SIGHUP raises :class:`Hangup` again (asyncio would leave it at
    its default, which kills the process before the cleanup)."""
    import asyncio

    try:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
    except RuntimeError:  # no loop running any more
        pass
    signal.signal(signal.SIGHUP, _raise)
