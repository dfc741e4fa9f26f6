"""Shared fixtures: real planted jobs, always killed in teardown."""

from __future__ import annotations

import compileall
from pathlib import Path

import pytest

from real_jobs import PlantedJob


@pytest.fixture
def planted(tmp_path):
    """Factory: ``planted("straggler", nproc=3)`` starts a real job and waits for its ranks."""
    jobs: list[PlantedJob] = []

    def start(scenario: str, nproc: int = 3, wait: bool = True, **kwargs) -> PlantedJob:
        job = PlantedJob(tmp_path / f"job{len(jobs)}", scenario, nproc=nproc, **kwargs).start()
        jobs.append(job)
        if wait:
            job.wait_for_ranks()
        return job

    yield start
    for job in jobs:
        job.stop()


def pytest_configure(config):
    """Compile trainwatch's own modules once, before any test starts a process: with
    PYTHONDONTWRITEBYTECODE set (as on CI's machines) every trainwatch command and rank would
    otherwise compile them again, about a CPU-second each on a suite that is bound by CPU."""
    if not hasattr(config, "workerinput"):  # the controller, not each xdist worker
        root = Path(__file__).resolve().parents[1]
        for folder in ("probes", "tui"):
            compileall.compile_dir(root / folder, quiet=2)


def pytest_collection_modifyitems(config, items):
    """Every test under tests/jobs/ starts real processes: mark it ``job`` (``-m 'not job'`` skips them)."""
    for item in items:
        if "jobs" in item.path.parent.parts[-1:]:
            item.add_marker(pytest.mark.job)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The real SLURM of tests/infra/slurm_up.sh (nodes tw1, tw2), started if needed.

    Skips where SLURM/munge are not installed; under CI=true that is a failure instead.
    """
    import slurm_cluster as cluster

    reason = cluster.unavailable_reason()
    if reason:
        if cluster.in_ci():
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)
    cluster.up()
    return cluster
