"""The hand-made TUI snapshots survive the JSON boundary unchanged."""

from trainwatch.probes.snapshot import Snapshot

from tui_samples import crashed, gpu_wait, healthy, straggler


def test_samples_round_trip_as_json():
    for snap in (healthy(), straggler(), crashed(), gpu_wait()):
        assert Snapshot.from_json(snap.to_json()) == snap
