"""The collector paused around big batches of acyclic objects (probes/gc_pause.py) is always given back."""

from __future__ import annotations

import gc

import pytest

from trainwatch.probes.gc_pause import gc_paused
from trainwatch.probes.remote.merge import merge_nodes


def test_the_collector_is_paused_inside_and_as_it_was_after():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner one found it paused: it leaves it so
    assert gc.isenabled()


def test_a_merge_that_fails_gives_the_collector_back():
    with pytest.raises(ValueError, match="no node answered"):
        merge_nodes([])
    assert gc.isenabled()
