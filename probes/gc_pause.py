"""The cyclic garbage collector paused while a big batch of acyclic objects is made.

Decoding a RAS report or a thousand nodes' answers, and merging and judging their ranks, makes
tens of thousands of objects with no cycles among them (records, tuples, dicts): reference
counting frees them. Collections the allocations trigger meanwhile walk them again and again, a
cost that grows faster than the batch (a fifth of decode and merge at 8,192 ranks, a third at 32,768).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collection inside; the collector as it was afterwards (one caller inside another,
    or another thread, leaves it as that caller found it)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
