"""GPU power/GPM and log growth where people read them: the detail pane and summary.md."""

from __future__ import annotations

from dataclasses import replace

from trainwatch.probes.evidence.summary import render
from trainwatch.probes.snapshot import GpuDevice, HostInfo, LogActivity, RankGpu, Snapshot
from trainwatch.tui.widgets.detail import detail_text

from tui_samples import NOW, straggler

H100 = dict(power_w=595.3, power_limit_w=700.0, sm_active_pct=87.5, tensor_active_pct=61.2, dram_bw_pct=43.0)


def test_detail_pane_shows_power_gpm_and_log_growth():
    rank = replace(straggler().rank(0), gpu=RankGpu(index=0, util_pct=100.0, **H100), log_path="/w/rank0.log",
                   log=LogActivity(age_s=1140.0, every_s=10.0, longest_s=12.0))
    text = detail_text(rank, NOW).plain
    assert "power 595 of 700 W · SM active 88% · tensor 61% · DRAM bw 43%" in text
    assert "last output 19 min ago; it wrote every 10 s" in text  # the verdict's words


def test_detail_pane_without_gpm_or_rhythm_says_only_what_is_known():
    rank = replace(straggler().rank(0), gpu=RankGpu(index=0, util_pct=100.0, power_w=70.0), log_path="/w/shared.log",
                   log=LogActivity(age_s=5.0, own=False))
    text = detail_text(rank, NOW).plain
    assert "power 70 W" in text and "SM active" not in text and "it wrote every" not in text
    assert "last output 5 s ago (a shared log)" in text


def test_summary_lists_power_and_gpm_per_gpu():
    snap = replace(straggler(), hosts=(HostInfo("node1", gpus=(GpuDevice(index=0, name="NVIDIA H100", util_pct=100.0,
                                                                          **H100),)),))
    text = render(snap, [], [], reason=None, redacted=True, sources={})
    assert "util 100%" in text and ", power 595 / 700 W, SM active 88%, tensor 61%, DRAM bw 43%" in text


def test_log_activity_survives_json_and_old_snapshots_still_read():
    snap = straggler()
    rank = replace(snap.rank(0), log=LogActivity(age_s=1140.0, every_s=10.0, longest_s=12.0, own=False, bar_s=8.02),
                   longest_quiet_s=8.5, collective_timeout_s=1800.0)
    snap = replace(snap, ranks=(rank, *snap.ranks[1:]))
    back = Snapshot.from_json(snap.to_json()).rank(0)
    assert back.log == rank.log and (back.longest_quiet_s, back.collective_timeout_s) == (8.5, 1800.0)
    old = snap.to_dict()
    for key in ("log", "longest_quiet_s", "collective_timeout_s"):
        del old["ranks"][0][key]
    assert Snapshot.from_dict(old).rank(0).log is None
