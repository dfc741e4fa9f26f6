"""The live view without py-spy: one clear warning line, no traceback, the ranks still listed."""

from __future__ import annotations

from trainwatch.probes.live import open_source
from trainwatch.tui.app import TrainwatchApp


async def test_missing_pyspy_is_one_clear_line(planted, monkeypatch):
    job = planted("straggler", nproc=2)
    monkeypatch.setenv("TRAINWATCH_PYSPY", "/nonexistent/py-spy")
    source = open_source(job.pid, window=1.0)
    try:
        app = TrainwatchApp(source, interval=30.0)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(100):
                await pilot.pause(0.1)
                if app.snapshot is not None:
                    break
            snapshot = app.snapshot
            assert snapshot is not None and snapshot.verdict.kind == "unknown"
            assert "py-spy is not installed" in snapshot.verdict.summary
            assert [w for w in snapshot.warnings if "py-spy" in w] and len(snapshot.ranks) == 2
            alerts = str(app.query_one("#alerts").render())  # the line under the header
            assert "py-spy is not installed" in alerts and "pip install py-spy" in alerts
    finally:
        source.close()
