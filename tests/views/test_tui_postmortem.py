"""The monitor on a dead job's leftovers (`trainwatch open DUMPS LOGS`): the same screens, read-only."""

from __future__ import annotations

from pathlib import Path

from trainwatch.probes import PostMortemSource
from trainwatch.tui.app import TrainwatchApp

from test_tui_app import screen_text, until

DEAD = Path(__file__).parents[1] / "fixtures" / "dead" / "gloo-2.13-mismatch"


async def test_dead_job_screen_names_the_culprit_and_the_collective(tmp_path):
    for size in ((80, 24), (120, 40)):
        source = PostMortemSource([DEAD])
        app = TrainwatchApp(source, live=False, title="trainwatch: gloo-2.13-mismatch")
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: app.polls == 1)
            text = screen_text(app)
            assert "MISMATCH" in text, text
            assert "rank 2 enqueued all_gather #5" in text, text
            assert "▶2" in text  # the culprit's row is marked
            if size == (120, 40):
                assert "sync_metrics" in text and "sync_gradients" in text, text
                app.save_screenshot("postmortem.svg", str(tmp_path))
        source.close()
    assert (tmp_path / "postmortem.svg").stat().st_size > 1000
