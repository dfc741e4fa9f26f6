"""The log growth reader: one stat per look, intervals between writes learnt while watching."""

from __future__ import annotations

import os

from trainwatch.probes.read.logs.loggrowth import LogGrowthWatch


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


def test_progress_bar_rates():
    from trainwatch.probes.read.logs.loggrowth import bar_rate
    assert bar_rate(" 45%|████▌     | 45/100 [00:10<00:12,  4.00it/s, loss=0.1]") == 0.25
    assert bar_rate("Epoch 0:  7%|▋ | 7/100 [01:03<14:00,  9.02s/it, v_num=0]") == 9.02
    assert bar_rate("45it [00:10, 4.00it/s]") == 0.25
    assert bar_rate("  3%|▎ | 3/? [1:00:10, 20.00s/batch]") == 20.0
    # finished (the shards loaded long before training went quiet), no rate yet, or no bar at all
    assert bar_rate("Loading checkpoint shards: 100%|██████████| 4/4 [00:05<00:00,  1.25s/it]") is None
    assert bar_rate("  0%|          | 0/100 [00:00<?, ?it/s]") is None
    assert bar_rate("step 20 loss 0.1234") is None


def test_a_bar_as_last_line_gives_the_rhythm_on_first_look(tmp_path):
    log = tmp_path / "rank0.log"
    write(log, "{'loss': 2.1, 'learning_rate': 5e-05}\n 12%|█▏ | 120/1000 [16:02<1:57:36,  8.02s/it]", 1000.0)
    assert LogGrowthWatch().look(str(log)).bar_s == 8.02
    other = tmp_path / "other.log"
    write(other, " 12%|█▏ | 120/1000 [16:02<1:57:36,  8.02s/it]\nsaving checkpoint\n", 1000.0)
    assert LogGrowthWatch().look(str(other)).bar_s is None  # something else was written after it
