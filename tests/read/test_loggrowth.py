"""The log growth reader: one stat per look, intervals between writes learnt while watching."""

from __future__ import annotations

import os

from trainwatch.probes.read.loggrowth import LogGrowthWatch


def write(path, text: str, at: float) -> None:
    with open(path, "a") as fh:
        fh.write(text)
    os.utime(path, (at, at))


def test_first_look_knows_the_last_write_but_not_the_rhythm(tmp_path):
    log = tmp_path / "rank0.log"
    write(log, "step 1\n", 1000.0)
    growth = LogGrowthWatch().look(str(log))
    assert (growth.last_write_at, growth.grew, growth.intervals, growth.usual_every_s) == (1000.0, False, (), None)


def test_growth_between_looks_teaches_the_interval(tmp_path):
    log, watch = tmp_path / "rank0.log", LogGrowthWatch()
    write(log, "step 1\n", 1000.0)
    watch.look(str(log))
    for i, at in enumerate((1010.0, 1020.0, 1032.0), start=2):
        write(log, f"step {i}\n", at)
        growth = watch.look(str(log))
        assert growth.grew
    assert growth.intervals == (10.0, 10.0, 12.0)
    assert (growth.usual_every_s, growth.longest_s, growth.last_write_at) == (10.0, 12.0, 1032.0)
    again = watch.look(str(log))  # nothing new: no growth, the history stays
    assert not again.grew and again.intervals == (10.0, 10.0, 12.0)


def test_replaced_file_counts_as_a_write(tmp_path):
    log, watch = tmp_path / "rank0.log", LogGrowthWatch()
    write(log, "a long first line\n", 1000.0)
    watch.look(str(log))
    log.unlink()
    write(log, "x\n", 1005.0)  # rotated: smaller, another inode
    growth = watch.look(str(log))
    assert growth.grew and growth.intervals == (5.0,)


def test_missing_or_no_path_is_none(tmp_path):
    watch = LogGrowthWatch()
    assert watch.look(None) is None and watch.look(str(tmp_path / "gone.log")) is None
