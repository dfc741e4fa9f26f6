"""A collective gloo aborts as a mismatch: the rank whose call differs is named, not the rank gloo
killed, with gloo's (or c10d's) own words, through `watch` and through `open`.

One rank all_gathers another size (`tui/planted.py` gathersize, `--culprit` the odd rank). gloo
aborts (SIGABRT) the rank that *receives* a chunk bigger than its own call expected: the odd rank's
neighbour when the odd size is the bigger, the odd rank itself when it is the smaller. Under
`trainwatch run` the Flight Recorder records gloo's collectives and the ranks failed by the abort
leave it in their last words; c10d's fingerprint check (TORCH_DISTRIBUTED_DEBUG=DETAIL) names
every rank's call without it; with neither, nothing tells the odd call, and the verdict says so.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from real_jobs import PlantedJob
from watching import TRAINWATCH, Watch

pytestmark = [pytest.mark.job, pytest.mark.slow]
GLOO_WORDS = "“Received data size doesn't match expected size. Is there a distributed collective mismatch"


def crash_under_watch(workdir: Path, culprit: int, *, armed: bool, odd_numel: int = 5,
                      env: dict | None = None) -> tuple[dict, PlantedJob]:
    prefix = [*TRAINWATCH, "run", "--out", str(workdir / "run"), "--"] if armed else None
    args = ["--culprit", str(culprit), "--odd-numel", str(odd_numel), "--fail-step", "12"]
    with PlantedJob(workdir / "job", "gathersize", nproc=3, deadline=60, step_s=0.25, prefix=prefix,
                    script_args=args, extra_env=env) as job:
        job.wait_for_ranks(steps=0)
        watch = Watch(job.pid, workdir)
        crashed = watch.until(lambda e: e["event"] == "crashed", 60)
        watch.until(lambda e: e["event"] == "job_ended", 60)
        watch.finish()
        try:  # `trainwatch run` writes what the dead job left as the job ends: let it finish, not kill it
            job.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass  # the teardown kills it; the leftovers test then says what was missing
    return crashed, job


def opened(*paths: Path) -> dict:
    out = subprocess.run([*TRAINWATCH, "open", *map(str, paths), "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["verdict"]


def test_the_rank_that_sent_the_bigger_size_is_named_under_run(tmp_path):
    """Rank 0 (the odd one, bigger) lives on; gloo aborts rank 1, which received its chunk."""
    crashed, _ = crash_under_watch(tmp_path, culprit=0, armed=True)
    assert crashed["culprits"] == [0], crashed
    summary = crashed["summary"]
    assert "rank 0 enqueued all_gather of [5]" in summary and "gloo aborted rank 1 (killed by SIGABRT)" in summary
    assert GLOO_WORDS in summary and "Flight Recorder" in summary
    assert "typing_extensions" not in summary and "site-packages" not in summary
    left = opened(tmp_path / "run")  # what the dead job left, judged the same way
    assert left["kind"] == "crashed" and left["culprits"] == [0], left
    assert GLOO_WORDS in left["summary"]


def test_the_odd_rank_gloo_aborted_itself_is_named_under_run(tmp_path):
    """Rank 2's tensor is the smaller: it receives a bigger chunk and gloo aborts it."""
    crashed, _ = crash_under_watch(tmp_path, culprit=2, armed=True, odd_numel=3)
    assert crashed["culprits"] == [2], crashed
    assert "rank 2's all_gather" in crashed["summary"] and "gloo aborted rank 2" in crashed["summary"]


def test_c10ds_fingerprints_name_the_odd_rank_without_the_flight_recorder(tmp_path):
    crashed, job = crash_under_watch(tmp_path, culprit=1, armed=False, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert crashed["culprits"] == [1], crashed
    assert "rank 1 enqueued all_gather of [5]" in crashed["summary"] and "c10d raised on ranks 0-2" in crashed["summary"]
    left = opened(job.log)
    assert left["culprits"] == [1], left


def test_without_a_record_of_the_sizes_no_rank_is_blamed_and_gloo_is_quoted(tmp_path):
    """Unarmed, no DETAIL: every rank sits at the same all_gather line; the words say what gloo
    said and that the odd call cannot be told, rather than blaming the rank it killed."""
    crashed, job = crash_under_watch(tmp_path, culprit=2, armed=False)
    assert crashed["culprits"] == [], crashed
    assert "gloo aborted rank 0" in crashed["summary"] and GLOO_WORDS in crashed["summary"]
    assert "cannot be told" in crashed["summary"]
    left = opened(job.log)
    assert left["kind"] == "crashed" and left["culprits"] == [] and GLOO_WORDS in left["summary"], left
