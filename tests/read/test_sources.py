"""The collective-state sources in read/collectives/sources/: each fills a field the evidence record has."""

from __future__ import annotations

import dataclasses

from trainwatch.probes.observed import ObservedJob
from trainwatch.probes.read.collectives.collective_feed import CollectiveFeed
from trainwatch.probes.read.processes.process import JobProcesses
from trainwatch.probes.read.collectives.sources import CollectiveSource, source_classes


def test_every_source_fills_a_field_of_the_evidence_record():
    fields = {f.name for f in dataclasses.fields(ObservedJob)}
    found = {cls.__module__.rsplit(".", 1)[1]: cls.field for cls in source_classes()}
    assert {"flight_recorder", "nccl_ras"} <= set(found)
    assert set(found.values()) <= fields, "a source names a field ObservedJob lacks"
    assert len(set(found.values())) == len(found), "two sources fill one field"


def test_a_failing_source_says_why_and_the_others_still_answer():
    class Broken(CollectiveSource):
        field = "collectives"

        def fetch(self, job):
            raise RuntimeError("a probe bug")

        def reading(self, job):
            raise RuntimeError("another one")

    job = JobProcesses(launcher="torchrun", root_pid=1, host="h")
    feed = CollectiveFeed(job, sources=[Broken, *[c for c in source_classes() if c.field != "collectives"]])
    try:
        feed.wait(5)
        evidence = feed.evidence()
    finally:
        feed.close()
    assert evidence.fields["collectives"] is None and "ras" in evidence.fields
    assert ObservedJob(job=None, **evidence.fields).collective_state() is None  # type: ignore[arg-type]
    assert "collective state from collectives lost: RuntimeError: another one" in evidence.notes, evidence.notes


def test_a_rank_whose_flight_recorder_read_fails_is_named_in_the_notes(monkeypatch):
    """A damaged record read in the source's per-rank thread: that rank is named with the error, not dropped unsaid."""
    from trainwatch.probes.read.collectives.sources import FeedOptions, flight_recorder
    from trainwatch.probes.read.processes.process import RankProcess

    def broken(self, proc, sock, since):
        raise ValueError(f"damaged entry in rank {proc.rank}'s trace")

    monkeypatch.setattr(flight_recorder.Source, "_fetch_rank", broken)
    job = JobProcesses(launcher="torchrun", root_pid=1, host="h", ranks=(RankProcess(pid=1, rank=3),))
    source = flight_recorder.Source(FeedOptions())
    source.fetch(job)
    assert source.reading(job).notes == ("rank 3: Flight Recorder read failed: ValueError: damaged entry in rank 3's trace",)
