"""SVG snapshots of the monitor at 80x24 and 120x40 (fixed clock, hand-made snapshots)."""

from __future__ import annotations

import pytest

from trainwatch.tui.app import TrainwatchApp

from tui_samples import ListSource, clock, crashed, ddp_straggler, gpu_wait, healthy, pods_pending, straggler

SAMPLES = {"healthy": healthy, "straggler": straggler, "crashed": crashed, "ddp": ddp_straggler}


async def _settle(pilot) -> None:
    app = pilot.app
    for _ in range(100):
        if app.polls >= 1:
            break
        await pilot.pause(0.05)
    app.clear_notifications()  # toasts are tested elsewhere; keep the picture stable
    await pilot.pause()


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@pytest.mark.parametrize("name", list(SAMPLES))
def test_monitor_snapshot(snap_compare, name, size):
    app = TrainwatchApp(ListSource(SAMPLES[name]()), interval=60.0, clock=clock)
    assert snap_compare(app, terminal_size=size, run_before=_settle)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_culprit_detail_snapshot(snap_compare, size):
    """The view opens on the straggler: its where and its frame in the user's code (highlighted)
    are on screen without scrolling, even at 80x24."""
    app = TrainwatchApp(ListSource(straggler()), interval=60.0, clock=clock)
    assert snap_compare(app, terminal_size=size, run_before=_settle)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_gpu_wait_with_steps_snapshot(snap_compare, size):
    """gpu_wait in the waiting colour; the step column where it fits, the step in the detail always."""
    app = TrainwatchApp(ListSource(gpu_wait()), interval=60.0, clock=clock)
    assert snap_compare(app, terminal_size=size, run_before=_settle)


def test_help_snapshot(snap_compare):
    app = TrainwatchApp(ListSource(healthy()), interval=60.0, clock=clock)
    assert snap_compare(app, terminal_size=(80, 24), press=["question_mark"], run_before=_settle)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_pods_never_scheduled_snapshot(snap_compare, size):
    """A --k8s job from a login box: the pods named in the header, the Pending pod's ranks with
    Kubernetes' words where their place would be, the verdict naming them."""
    app = TrainwatchApp(ListSource(pods_pending()), interval=60.0, clock=clock)
    assert snap_compare(app, terminal_size=size, run_before=_settle)
